"""The run folder's own files, whatever ``logger=`` says: ``resolved_config.yaml`` (at the start),
``metrics.jsonl`` (a line per logged step) and ``summary.json`` (at the end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.observe.durable import write_json, write_text
from trainer.observe.metrics import MetricsFile
from trainer.observe.sink import Sink


def config_files(run_dir: Path) -> list[Path]:
    """The resolved config this sink writes and Hydra's own files (W&B keeps them as an artifact)."""
    hydra_dir = run_dir / ".hydra"
    return [run_dir / "resolved_config.yaml"] + [hydra_dir / n for n in ("config.yaml", "overrides.yaml", "hydra.yaml")]


class FilesSink(Sink):
    def __init__(self, *, run_dir: Path, cfg_dict: dict, start_step: int = 0):
        from omegaconf import OmegaConf

        self.run_dir = run_dir
        # rewritten by every resume: atomically
        write_text(config_files(run_dir)[0], OmegaConf.to_yaml(OmegaConf.create(cfg_dict)))
        self.metrics = MetricsFile(run_dir / "metrics.jsonl", keep_through_step=start_step)

    def log_step(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)

    def log_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.run_dir / "summary.json", summary)

    def close(self, *, exit_code: int) -> None:
        self.metrics.close()


def output_listing(run_dir: Path) -> str:
    """``outputs in DIR: a, b/, ...``: what the run folder holds when the run ends, read from the folder (files, and
    folders with a ``/``), so that every file and figure a run wrote is named. Hidden files (the folder's lock) are
    left out; hidden folders (``.hydra/``) are not."""
    entries = sorted(run_dir.iterdir(), key=lambda p: p.name) if run_dir.is_dir() else []
    names = [p.name + "/" if p.is_dir() else p.name for p in entries if p.is_dir() or not p.name.startswith(".")]
    return f"outputs in {run_dir}: " + ", ".join(names)
