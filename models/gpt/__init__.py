"""GPT-2-style decoder: the module (model.py) and its tensor-parallel plan (parallelize.py)."""
