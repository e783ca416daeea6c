"""The training objectives a run may name instead of its family's loss (``trainer.objective``), as plain values: no
torch import (validation reads them). The losses themselves: ``models/preference.py``."""

from __future__ import annotations

from dataclasses import dataclass

#: the training objectives on preference pairs (``trainer.objective``)
OBJECTIVES = ("dpo", "simpo")
#: objectives that compare the policy with a reference model
WITH_REFERENCE = ("dpo",)
#: where that reference comes from (``trainer.preference.reference``): its log-probabilities computed in one pass
#: before step 1, or held on the ranks and run on every batch (``trainer/loop/reference.py``)
REFERENCES = ("pass", "copy")


def holds_reference(objective: str, reference: str) -> bool:
    """Whether a run keeps its reference on the ranks and runs it on every batch (``trainer.objective=dpo`` with
    ``trainer.preference.reference=copy``): what the planner counts (its weights without LoRA, a forward a batch)."""
    return objective in WITH_REFERENCE and reference == "copy"


@dataclass(frozen=True)
class PreferenceObjective:
    """``trainer.objective`` (dpo, simpo) with ``trainer.preference.*``."""

    name: str = "dpo"
    beta: float = 0.1
    label_smoothing: float = 0.0
    gamma: float = 0.5
    """SimPO's target reward margin (``gamma / beta`` is subtracted from the length-normalised difference)."""

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ValueError(f"PreferenceObjective(name={self.name!r}): use one of {OBJECTIVES}")

    @property
    def needs_reference(self) -> bool:
        return self.name in WITH_REFERENCE
