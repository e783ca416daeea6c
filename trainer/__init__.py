"""meshtrain's trainer: launcher, worker, training loop, data, metrics and their sinks."""

from conf.quiet import quiet_torchao

quiet_torchao()
