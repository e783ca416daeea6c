"""meshtrain entry point: `python train.py parallel=hybrid pp.micro_batches=8`.

Thin on purpose: Hydra composes conf/ with the command line's overrides, trainer.task validates,
launches the workers and returns the objective (tokens/s by default) for sweepers.
"""

import sys
import traceback

import hydra
from omegaconf import DictConfig

from conf.resolvers import register_resolvers
from conf.schema import register_configs

register_resolvers()
register_configs()


_task_started = False


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    global _task_started
    _task_started = True
    from trainer.task import run_task

    return run_task(cfg)


def cli() -> None:
    """``main()`` with one exit code for every refused config: Hydra ends a run whose overrides do not
    compose (unknown key, wrong type) with exit code 1 before the task starts, or with
    ``HYDRA_FULL_ERROR=1`` lets the error itself escape; either is bad input (2)."""
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and not _task_started:
            sys.exit(2)
        raise
    except Exception:
        if _task_started:
            raise
        traceback.print_exc()  # the full trace HYDRA_FULL_ERROR=1 asks for, then the documented code
        sys.exit(2)


if __name__ == "__main__":
    cli()
