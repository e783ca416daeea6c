"""Token-weighted loss under every engine (real workers): samples with different numbers of masked targets
(``tests/masked_text.py``) make ranks and micro-batches hold unequal counts, and every layout still trains to
single's losses, gradient norms and validation loss on the same global batches. A mean of per-rank or
per-micro-batch means would not (docs/fine-tuning.md)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FAST, assert_losses_close, case_multirun

pytestmark = pytest.mark.slow

LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    # 4 samples per replica in 2 accumulated chunks: counts differ between ranks and between chunks
    "ddp_accumulated": {"defaults": [{"override /parallel": "ddp"}], "data": {"micro_batch_size": 2}},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "tp": {"defaults": [{"override /parallel": "tp"}]},
    # pipeline stages over an FSDP2 dp dimension: the last stage counts the targets over its dp group
    "hybrid_dp2_pp2": {
        "defaults": [{"override /parallel": "hybrid"}],
        "tp": {"size": 1},
        "pp": {"micro_batches": 2},
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cases = {name: {**layout, "data": {**layout.get("data", {}), "_target_": "tests.masked_text.MaskedText"}}
             for name, layout in LAYOUTS.items()}  # fmt: skip
    # no checkpoint: metrics are compared (the last step would write one by default)
    steps = (
        "trainer.max_steps=3",
        "trainer.eval_every=3",
        "trainer.eval_batches=2",
        "pp.trace_step=0",
        "trainer.checkpoint_every=0",
    )
    return case_multirun(cases, *FAST, *steps, base=tmp_path_factory.mktemp("runs"), group="masked", timeout=900)


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", [c for c in LAYOUTS if c != "single"])
def test_masked_targets_train_like_single(runs, case):
    ref, got = metrics(runs["single"]), metrics(runs[case])
    assert len(got) == 3
    print(f"{case}: losses {[m['loss'] for m in got]}, single {[m['loss'] for m in ref]}")
    assert_losses_close([m["loss"] for m in got], [m["loss"] for m in ref], rel=1e-5)
    assert_losses_close([m["grad_norm"] for m in got], [m["grad_norm"] for m in ref], rel=1e-4)
    assert got[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], rel=1e-5)


def test_single_reports_the_token_mean_of_the_global_batch(runs):
    """Step 1's loss is the full batch's token mean, computed here from the same initial model and batch."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from models.losses import token_cross_entropy
    from models.spec import builder_kwargs

    cfg = OmegaConf.load(runs["single"] / ".hydra" / "config.yaml")
    inputs, targets = instantiate(cfg.data, seed=int(cfg.trainer.seed)).global_batch(1)
    torch.manual_seed(int(cfg.trainer.seed))
    model = instantiate(builder_kwargs(cfg.model))
    with torch.no_grad():
        logits = model(inputs)
        want = float(token_cross_entropy(logits, targets))
        per_rank = [float(token_cross_entropy(a, b)) for a, b in zip(logits.chunk(2), targets.chunk(2))]
    assert metrics(runs["single"])[0]["loss"] == pytest.approx(want, rel=1e-5)
    assert abs(sum(per_rank) / 2 - want) > 1e-3 * want  # the old mean of two ranks' means: another number
