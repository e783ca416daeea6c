"""Models whose layers can be split into stages with their parameter names (FQNs) kept."""

from models.quiet import quiet_torchao

quiet_torchao()
