"""OmegaConf resolvers needed before Hydra composes the config.

``mt_strategy`` gives ``parallel._target_`` its default: the class the strategy registry
(``parallel/assembly/registry.py``) names for ``parallel.name``.

``mt_stamp`` formats the launch time of this job. Under torchrun every rank runs ``hydra.main`` and
Hydra's ``${now:}`` may differ by a second between ranks, giving one output folder per rank
(hydra#2070). All local ranks of one torchrun share their parent, the elastic agent, so under
torchelastic the stamp is the agent's start time: one folder for the whole job on a node.
"""

from __future__ import annotations

import os
import sys
import time
from functools import lru_cache

from omegaconf import OmegaConf


@lru_cache(maxsize=1)
def _launch_time() -> float:
    if "TORCHELASTIC_RUN_ID" in os.environ or "SLURM_STEP_ID" in os.environ:
        import psutil

        try:
            return psutil.Process(os.getppid()).create_time()
        except (psutil.Error, OSError):  # pragma: no cover - no parent info: fall back to now
            pass
    return time.time()


def launch_stamp(fmt: str) -> str:
    return time.strftime(fmt, time.localtime(_launch_time()))


#: what ``${mt_help:...}`` gives when the command line does not ask for help (``--cfg hydra`` shows it)
HELP_NOT_ASKED = "(listed by --help)"


def help_asked(argv: list[str] | None = None) -> bool:
    return bool({"--help", "-h"} & set((sys.argv if argv is None else argv)[1:]))


def help_text(part: str) -> str:
    """``${mt_help:groups}`` / ``${mt_help:keys}`` in conf/hydra/help/meshtrain.yaml (see conf/help.py).

    Hydra resolves these at every compose, not only when it prints help, and listing the groups walks every
    config folder: 2 s of a 4 s one-process run (measured, cProfile). So the lists are built only when the
    command line asks for --help."""
    if not help_asked():
        return HELP_NOT_ASKED
    from conf.help import help_groups, help_keys

    return help_groups() if part == "groups" else help_keys()


def register_resolvers() -> None:
    from parallel.assembly.registry import strategy_target

    if not OmegaConf.has_resolver("mt_stamp"):
        OmegaConf.register_new_resolver("mt_stamp", launch_stamp)
    if not OmegaConf.has_resolver("mt_strategy"):  # the default parallel._target_ of parallel.name
        OmegaConf.register_new_resolver("mt_strategy", strategy_target)
    if not OmegaConf.has_resolver("mt_help"):
        OmegaConf.register_new_resolver("mt_help", help_text)
