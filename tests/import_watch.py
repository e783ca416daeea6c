"""The fast tier's one import rule: no unit test loads transformers' modelling code (tests/unit/conftest.py checks
every unit test; a test that needs it belongs in tests/system)."""

from __future__ import annotations

import sys

import pytest

#: building or loading any transformers model imports it; its import costs 3.2-3.6 s of CPU per interpreter after
#: torch (README, Tests: it pulls in torchao, dynamo and scipy through transformers' quantizers), paid again by each
#: xdist worker
MODELLING_CODE = "transformers.modeling_utils"


def refuse_new_import(name: str, *, loaded_before: bool) -> None:
    """Fails the running test if module ``name`` is imported now and was not before the test's set-up."""
    if name in sys.modules and not loaded_before:
        pytest.fail(
            f"this test loads transformers' modelling code ({name}, about 3.6 s per interpreter): "
            "move it to tests/system",
            pytrace=False,
        )
