"""What a validation check reports into, and the error that lists every problem at once. No torch import."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.launch.environment import ExternalLaunch


class ConfigError(ValueError):
    """One or more settings cannot work together; the message lists each with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({len(self.problems)} problem(s)); no worker was started:\n{lines}")


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    external: ExternalLaunch | None = None
    """Set when torchrun / Slurm started this process (ranks and addresses are theirs)."""
    runs: Callable[[Any], bool] | None = None
    """Whether another config (a layout a refusal would suggest) passes validation for this run; unset while such a
    candidate is itself validated (trainer/checks/suggest.py)."""
    _typed: tuple[Any, Any] | None = field(default=None, repr=False)

    def model(self, cfg: Any) -> Any:
        """``cfg.model`` typed (``trainer.typed.run_spec.model_config``), built once per validation: the checks that
        read the family's config (data, model, precision, the strategy's rules) share it (1 ms a build)."""
        if self._typed is None or self._typed[0] is not cfg:
            from trainer.typed.run_spec import model_config

            self._typed = (cfg, model_config(cfg))
        return self._typed[1]

    def error(self, msg: str) -> None:
        self.problems.append(msg)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def require(self, key: str, value: Any, ok: bool, rule: str) -> None:
        """``key=value: rule`` unless ``ok``."""
        if not ok:
            self.error(f"{key}={value}: {rule}")


#: ``check(cfg, layout, findings)``: one validation check
Check = Callable[[Any, Any, Findings], None]


def number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (bools and strings are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite(value: Any) -> bool:
    n = number(value)
    return n is not None and math.isfinite(n)
