"""The installed ``meshtrain`` command (``pip install .``): ``meshtrain parallel=hybrid pp.micro_batches=8``
from any folder, the same as ``python train.py ...`` in a checkout; and what both share around Hydra (``run_cli``).

The configs ship inside the package (``conf/`` is a Python package with its YAML as package data), so
Hydra reads them from ``pkg://conf``; ``--config-dir DIR`` adds a user's own groups and options (their
model YAML, their experiment) in front of them without forking. Outputs go under the current folder
(``outputs/``, ``multirun/``), as with train.py. ``meshtrain export SRC --hf OUT`` is ``python -m trainer.export``.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

import hydra
from omegaconf import DictConfig

from conf.command_line import shell_expanded
from conf.resolvers import register_resolvers
from conf.schema import register_configs

register_resolvers()
register_configs()

EXIT_CONFIG = 2


class _Recorder:
    """``sys.stderr`` passed through, and kept until the task starts: what Hydra said when it refused the command
    line (it prints the error and exits 1)."""

    def __init__(self, stream: Any):
        self.stream, self.text, self.recording = stream, [], True

    def write(self, text: str) -> int:
        if self.recording and sum(map(len, self.text)) < 100_000:
            self.text.append(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_recorder: _Recorder | None = None


def task(cfg: DictConfig) -> float | None:
    """The Hydra task of train.py and ``meshtrain``: from here on errors are the run's, not the command line's."""
    global _recorder
    if _recorder is not None:
        _recorder.recording = False
        if sys.stderr is _recorder:
            sys.stderr = _recorder.stream
        _recorder = None
    from trainer.task import run_task

    return run_task(cfg)


def _refused(message: str) -> None:
    """Hydra refused the command line: add what meshtrain knows of the key (conf/keys.py), exit 2."""
    from conf.keys import append_hint

    hint = append_hint(message)
    if hint:
        print(hint, file=sys.stderr, flush=True)
    sys.exit(EXIT_CONFIG)


def run_cli(main: Callable[[], Any]) -> None:
    """``main()`` (a ``hydra.main``) with ``key=~/path`` expanded first (conf/command_line.py) and one exit code for
    every refused command line: Hydra ends a run whose overrides do not compose (unknown key, wrong type) with exit
    code 1 before the task starts, or with ``HYDRA_FULL_ERROR=1`` lets the error itself escape; either is bad input
    (2), and where Hydra suggests ``+key=value`` meshtrain says whether that key exists."""
    global _recorder
    sys.argv[1:] = shell_expanded(sys.argv[1:])
    _recorder = _Recorder(sys.stderr)
    sys.stderr = _recorder
    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and _recorder is not None:
            _refused("".join(_recorder.text))
        raise
    except Exception as exc:
        if _recorder is None:
            raise
        traceback.print_exc()  # the full trace HYDRA_FULL_ERROR=1 asks for, then the documented code
        _refused(f"{exc}")
    finally:
        if _recorder is not None and sys.stderr is _recorder:
            sys.stderr = _recorder.stream
        _recorder = None


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def _main(cfg: DictConfig) -> float | None:
    return task(cfg)


def main() -> None:
    if sys.argv[1:2] == ["export"]:  # a subcommand, not an override: the Hugging Face exporter
        from trainer.export import main as export

        sys.exit(export(sys.argv[2:]))
    run_cli(_main)


if __name__ == "__main__":
    main()
