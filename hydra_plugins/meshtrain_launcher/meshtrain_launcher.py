"""meshtrain's Slurm launcher, where Hydra looks for launchers (its ``hydra_plugins`` package).

The class is defined in trainer/sweeps/slurm.py; Hydra accepts a launcher only from a module under
``hydra_plugins``, so this subclass names it there. Selected by ``hydra/launcher=slurm``.
"""

from trainer.sweeps.slurm import RequeueingSlurmLauncher


class SlurmLauncher(RequeueingSlurmLauncher):
    pass
