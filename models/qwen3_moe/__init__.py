"""Qwen3-MoE: Qwen3's attention with mixture-of-experts feed-forwards (``models/moe.py``) in its sparse layers."""
