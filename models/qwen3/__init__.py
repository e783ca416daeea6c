"""Qwen3 dense decoder: the Llama blocks with per-head q/k RMSNorm and a head width set on its own."""
