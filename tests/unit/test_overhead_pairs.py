"""benchmarks/overhead.py's pairs and the models each runs: expert parallel only with the MoE model and the MoE model
only with it, refused (with what runs) before anything starts; ``--strategy all`` picks the pairs that run the
model."""

from __future__ import annotations

import re

import pytest

from benchmarks import bare_common
from benchmarks.overhead import PAIRS, layout_overrides, main, strategies_for


def test_all_runs_the_pairs_of_the_model():
    assert strategies_for("all", "gpt_small") == ["ddp", "fsdp", "tp", "pp", "hybrid"]
    assert strategies_for("all", "qwen3_moe_debug") == ["ep"] and strategies_for("ep", "qwen3_moe_debug") == ["ep"]
    assert "qwen3_moe_debug" in bare_common.MODELS  # the hand-written loops build it as train.py does
    assert PAIRS["ep"].overrides == ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "ep", "--model", "gpt_small"], "--strategy ep --model gpt_small: the ep pair runs --model "
         "qwen3_moe_debug or deepseek_v3_debug (expert parallel needs a mixture-of-experts model)"),
        (["--strategy", "fsdp", "--model", "qwen3_moe_debug"], "the fsdp pair runs --model gpt_small or llama_debug"),
        (["--strategy", "ep", "--nproc", "1"], "only a 2-rank pair of one dimension (ddp, fsdp, tp, pp) shrinks"),
    ],
)  # fmt: skip
def test_refused_before_anything_runs(argv, message, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr("benchmarks.overhead.run_bare", never)
    monkeypatch.setattr("benchmarks.overhead.run_meshtrain", never)
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(argv)


def test_the_ep_pair_keeps_its_two_ranks():
    assert layout_overrides(PAIRS["ep"], device="cuda", nproc=2) == ["topology.device=cuda"]
    assert layout_overrides(PAIRS["ddp"], device="cpu", nproc=1) == ["dp.size=1", "tp.size=1", "pp.size=1"]
