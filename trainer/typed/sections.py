"""A composed config's sections as plain values, what ``trainer/typed/`` types them from. No torch import."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def plain_values(node: DictConfig) -> dict[str, Any]:
    """A config section's plain values, resolved where its interpolations resolve (validation reads the model
    before ``${data.*}`` is checked: such a node is taken as written)."""
    try:
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)  # type: ignore[return-value]
    except OmegaConfBaseException:
        return OmegaConf.to_container(node, resolve=False, enum_to_str=True)  # type: ignore[return-value]
