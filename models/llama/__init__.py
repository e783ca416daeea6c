"""Llama-3-style decoder: config schema, spec (formulas, checks), module (model.py), tensor-parallel plan."""
