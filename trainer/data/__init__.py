"""Datasets whose global batch for step k depends only on (seed, k)."""
