"""Multirun bookkeeping: per-job status files and the Hydra callback that counts them."""
