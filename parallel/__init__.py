"""Parallel strategies and the shared pieces they are built from (layout, meshes, wrappers)."""
