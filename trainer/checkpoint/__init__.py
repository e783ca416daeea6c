"""Checkpoints with torch.distributed.checkpoint: atomic folders, markers, resume."""
