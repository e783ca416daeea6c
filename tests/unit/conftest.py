"""The unit tier: in-process tests; the few that start ``train.py`` expect it to refuse before any worker."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cold_train_runs(monkeypatch):
    """A refusal imports no torch: a cold interpreter answers sooner than starting the warm runner would
    (tests/warm_runner.py imports torch first), so the fast tier never starts it."""
    monkeypatch.setenv("MESHTRAIN_TESTS_COLD", "1")
