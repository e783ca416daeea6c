"""The fast tier's one import rule: no unit test loads transformers' modelling code (tests/unit/conftest.py watches
for it around every unit test; a test that needs it belongs in tests/system)."""

from __future__ import annotations

import sys

import pytest

#: building or loading any transformers model imports it; its import costs 3.2-3.6 s of CPU per interpreter after
#: torch (README, Tests: it pulls in torchao, dynamo and scipy through transformers' quantizers), paid again by each
#: xdist worker
MODELLING_CODE = "transformers.modeling_utils"


class ImportWatch:
    """Whether module ``name`` is imported, as last seen; ``look`` fails the test during which it was imported since
    the last look (once: the tests after it in the same process are not blamed)."""

    def __init__(self, name: str):
        self.name = name
        self.loaded = name in sys.modules

    def look(self) -> None:
        was, self.loaded = self.loaded, self.name in sys.modules
        if self.loaded and not was:
            pytest.fail(
                f"this test loads transformers' modelling code ({self.name}, about 3.6 s per interpreter): "
                "move it to tests/system",
                pytrace=False,
            )
