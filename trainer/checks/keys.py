"""A key no part of meshtrain reads (``+paralel=fsdp``), refused before any worker starts with the nearest key that
exists (conf/keys.py: what is read, and the nearest)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from conf.keys import unread_problems
from trainer.checks.findings import Findings


def check_keys(cfg: DictConfig, layout: Any, f: Findings) -> None:
    for problem in unread_problems(cfg):
        f.error(problem)
