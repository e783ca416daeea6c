"""Enum-typed choices for the config schemas: a typo (``optim.decay=linearr``) fails when Hydra composes the
config, before anything starts, with the valid values in the message:

    Error merging override optim.decay=linearr
    Invalid value 'linearr', expected one of [cosine, linear, constant]
        full_key: optim.decay

Members are named as users write them (``1f1b`` included, hence the functional API) and are ``str``
subclasses that print as their value, so code compares them with plain strings (``schedule == "1f1b"``),
uses them as dict keys and formats them unchanged. Workers receive plain strings (the trainer converts the
config with enum_to_str). No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Choice(str, Enum):
    """A config choice: equal to, hashed and printed as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return repr(str(self.value))

    @classmethod
    def values(cls) -> list[str]:
        return [str(m.value) for m in cls]


def choices(name: str, values: Iterable[str], *, module: str) -> type[Choice]:
    """``Choice`` enum whose member names are the values themselves (``1f1b`` is not an identifier).
    ``module`` must be the defining module's ``__name__`` so the enum pickles."""
    return Choice(name, {v: v for v in values}, module=module, qualname=name)  # type: ignore[return-value]
