"""Hydra config groups (YAML) and the typed schema that checks them at compose time (schema.py)."""

from conf.quiet import quiet_torchao

quiet_torchao()
