"""meshtrain's trainer: launcher, worker, training loop, data, metrics and their sinks."""
