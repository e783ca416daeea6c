"""meshtrain entry point: `python train.py parallel=hybrid pp.micro_batches=8`.

Thin on purpose: Hydra composes conf/ with the command line's overrides, trainer.task validates,
launches the workers and returns the objective (tokens/s by default) for sweepers.
"""

import hydra
from omegaconf import DictConfig

# importing trainer.command registers the resolvers and the schemas (as for the installed `meshtrain` command)
from trainer.command import run_cli, task


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return task(cfg)


def cli() -> None:
    """``main()`` as the command line runs it: ``~`` expanded, a refused command line exits 2 (trainer/command.py)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
