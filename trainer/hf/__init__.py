"""Hugging Face model folders: read before any worker starts (checks), loaded per shard in the workers, written by
the exporter. Every family's names go through its adapter (``models/hf_adapter.py``)."""
