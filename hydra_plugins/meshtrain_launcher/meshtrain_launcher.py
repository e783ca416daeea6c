"""meshtrain's Slurm and local launchers and Optuna sweeper, where Hydra looks for plugins (its ``hydra_plugins`` package).

The classes are defined in trainer/sweeps/slurm.py, trainer/sweeps/local.py and trainer/sweeps/optuna.py; Hydra accepts a plugin only
from a module under ``hydra_plugins``, so these subclasses name them there. Selected by ``hydra/launcher=slurm``, ``hydra/launcher=submitit_local``
and ``hydra/sweeper=optuna`` (swapped in by trainer/sweeps/callback.py).
"""

from trainer.sweeps.local import PacedLocalLauncher
from trainer.sweeps.optuna import EndingOptunaSweeper
from trainer.sweeps.slurm import RequeueingSlurmLauncher


class SlurmLauncher(RequeueingSlurmLauncher):
    pass


class OptunaSweeper(EndingOptunaSweeper):
    pass


class LocalLauncher(PacedLocalLauncher):
    pass
