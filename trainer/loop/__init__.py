"""The training loop: batch, engine step, gradient clipping, optimizer, measurements."""
