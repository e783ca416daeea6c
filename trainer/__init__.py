"""meshtrain's trainer: launcher, worker, training loop, data, metrics and their sinks."""

from models.quiet import quiet_torchao

quiet_torchao()
