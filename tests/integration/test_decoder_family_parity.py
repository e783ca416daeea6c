"""Llama under every strategy reproduces parallel=single (losses and gradient norms within 1e-4 relative): single,
ddp, fsdp, tp (vocabulary-sharded loss), mp, pp under each of the seven schedules, and a 4-rank hybrid (pp 2 x tp 2,
sequence parallel), one multirun of 13 jobs (tests/family_parity.py holds the cases and the checks). The other
family is tests/integration/test_decoder_family_parity_qwen3.py (Qwen3: Llama's blocks with per-head q/k RMSNorm and a head width set on its own).
"""

from __future__ import annotations

import pytest

from tests.family_parity import COMPARED, assert_matches_single, assert_single_trains, family_runs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # one multirun of 13 jobs in its fixture


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return family_runs("llama", tmp_path_factory.mktemp("llama"))


def test_single_trains(runs):
    assert_single_trains(runs)


@pytest.mark.parametrize("case", COMPARED)
def test_matches_single(case, runs):
    assert_matches_single(case, runs)
