"""Hydra config groups (YAML) and the typed schema that checks them at compose time (schema.py)."""

from models.quiet import quiet_torchao

quiet_torchao()
