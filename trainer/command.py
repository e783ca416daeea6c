"""The installed ``meshtrain`` command (``pip install .``): ``meshtrain parallel=hybrid pp.micro_batches=8``
from any folder, the same as ``python train.py ...`` in a checkout.

The configs ship inside the package (``conf/`` is a Python package with its YAML as package data), so
Hydra reads them from ``pkg://conf``; ``--config-dir DIR`` adds a user's own groups and options (their
model YAML, their experiment) in front of them without forking. Outputs go under the current folder
(``outputs/``, ``multirun/``), as with train.py. ``meshtrain export SRC --hf OUT`` is ``python -m trainer.export``.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from conf.resolvers import register_resolvers
from conf.schema import register_configs

register_resolvers()
register_configs()


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from trainer.task import run_task

    return run_task(cfg)


def main() -> None:
    if sys.argv[1:2] == ["export"]:  # a subcommand, not an override: the Hugging Face exporter
        from trainer.export import main as export

        sys.exit(export(sys.argv[2:]))
    _main()


if __name__ == "__main__":
    main()
