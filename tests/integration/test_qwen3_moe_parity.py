"""Qwen3-MoE (``models/qwen3_moe``, ``models/moe.py``) reproduces parallel=single under ddp, fsdp (experts sharded by
FSDP2 along the expert dimension), 1f1b (the auxiliary loss's gradient scaled per micro-batch as the LM loss is) and
expert parallel (``parallel/techniques/ep.py``: dp=2 x ep=2 on 2 ranks, dp=4 x ep=2 with the experts' own FSDP2 mesh
on 4). Losses, the auxiliary loss and gradient norms within 1e-6 relative over 3 steps; under ep also the final
parameters and routing biases (DeepSeek-V3's balancing, on), and the tokens per expert per layer over the run.

The load-balancing loss (on, 0.001) takes its expert counts over every data- and context-parallel rank's micro-batch
together (``model.balance_scope=global``, the default; ``parallel/techniques/moe_balance.py``): with one micro-batch
per step every layout runs the balance of the whole batch, so ddp, fsdp, dp2 x ep2, dp4 x ep2, tp, dp2 x ep2 x tp2
and cp2 x ep2 all match single running the whole batch of 8 in one pass. 1f1b with 4 micro-batches of 2 matches
single accumulating micro-batches of 2. With several micro-batches per rank the balance covers micro-batch j of
every dp rank (samples 0-1 and 4-5, then 2-3 and 6-7 under dp2), which no single run takes: dp2 x ep2 x pp2 (1f1b, 2
micro-batches) matches dp2 x ep2 accumulating 2 forwards of 2 under full activation checkpointing (the all-reduce of
the counts runs again in the recompute), and ``model.balance_scope=micro_batch`` (one forward's sequences) under
dp2 x ep2 accumulating forwards of 2 matches single accumulating micro-batches of 2, its step-1 auxiliary loss
not the global one's. A checkpoint of ep=2 resumes under ep=4.

The balance (``moe_aux_loss``, ``moe_max_imbalance``, the tokens per expert per layer) is the step's, summed over the
data-parallel ranks (and gathered over pp); the run's tokens per expert are in summary.json, pipelined or not, and
every run draws its expert-load heatmap (one panel per MoE layer) when it ends. Under tensor parallel (Qwen3's plan
on the attention and the dense layer, each sparse block whole on every tp rank: ``models/tensor_parallel.py``) the
balance is counted once, not once per tp rank. dp2 x ep2 also runs with op-level selective checkpointing, regional
compile (against eager single: the load-balancing loss's gradient, its summed counts and the experts' DTensor shards
inside compiled blocks), and bf16-mixed against bf16-mixed single (within bf16 rounding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import FAST, TrainRun, assert_losses_close, assert_parity, case_multirun, final_state, run_train
from trainer.observe.expert_load_figure import FILE, IMAGE, figure_size_px

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

LAST = {"trainer": {"checkpoint_every": 3}}  # the final parameters, read back from the step-3 checkpoint
NONE = {"trainer": {"checkpoint_every": 0}}
BIAS = {"model": {"bias_update_rate": 0.001}}  # DeepSeek-V3's balancing bias, moved every step from global counts
HYBRID = {"defaults": [{"override /parallel": "hybrid"}], "tp": {"size": 1}, "pp": {"size": 1}, **LAST}
SINGLE = {"defaults": [{"override /parallel": "single"}], **LAST}
BF16 = {"precision": "bf16-mixed"}
BF16_REL = 1e-2
MICRO = {"model": {"bias_update_rate": 0.001, "balance_scope": "micro_batch"}}  # one forward's sequences
TOL = 1e-6  # relative, losses, auxiliary losses and gradient norms
CASES: dict[str, dict] = {
    "single": {**SINGLE, **BIAS},  # the whole batch of 8 in one forward
    "ddp": {"defaults": [{"override /parallel": "ddp"}], **NONE, **BIAS},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}], **NONE, **BIAS},
    "1f1b": {
        "defaults": [{"override /parallel": "pp"}],
        "pp": {"schedule": "1f1b", "micro_batches": 4},
        **NONE,
        **BIAS,
    },
    # expert parallel: 2 ranks hold 4 experts each (their FSDP2 mesh is one rank); on 4 ranks ep=2 x expert
    # FSDP2 over 2, with forwards of 2 samples per rank, the balance over all 8
    "ep": {**HYBRID, "dp": {"size": 2}, "ep": {"size": 2}, **BIAS},
    "ep_fsdp4": {**HYBRID, "dp": {"size": 4}, "ep": {"size": 2}, **BIAS},
    "single_mb2": {**SINGLE, "data": {"micro_batch_size": 2}, **BIAS},
    # tensor parallel: attention (and the dense layer 3) split over tp, the sparse blocks whole on each tp rank
    "tp": {"defaults": [{"override /parallel": "tp"}], **LAST, **BIAS},
    # dp2 x ep2 x tp2 on 4 ranks: ep borrows dp; each tp rank's ep group exchanges the same tokens
    "ep_tp": {**HYBRID, "dp": {"size": 2}, "ep": {"size": 2}, "tp": {"size": 2, "sequence_parallel": True}, **BIAS},
    # cp2 x ep2 on 2 ranks (ep borrows cp): each rank routes its half of every sample, the load-balancing loss
    # takes its counts over the whole sequence (the cp group)
    "ep_cp": {**HYBRID, "dp": {"size": 1}, "cp": {"size": 2}, "ep": {"size": 2}, **BIAS},
    # torch's pipeline shape inference runs one real forward per stage at step 1: left out of the routing counts.
    # 2 micro-batches of 2 per rank: the balance of micro-batch j covers both dp ranks' j-th, as ep_ac_full_mb2's
    "ep_pp": {
        **HYBRID,
        "dp": {"size": 2},
        "ep": {"size": 2},
        "pp": {"size": 2, "micro_batches": 2, "schedule": "1f1b"},
        **BIAS,
    },
    # the trainer's techniques under dp2 x ep2: full recomputation (the all-to-alls and the counts' all-reduce run
    # again in backward) with gradient accumulation (2 forwards of 2 per rank); op-level selective checkpointing
    # (the experts' FSDP2 hooks inside the checkpointed block); bf16-mixed against bf16-mixed single
    "ep_ac_full_mb2": {
        **HYBRID,
        "dp": {"size": 2},
        "ep": {"size": 2},
        "data": {"micro_batch_size": 2},
        "trainer": {**LAST["trainer"], "activation_checkpointing": "full"},
        **BIAS,
    },
    # the per-micro-batch balance (model.balance_scope=micro_batch): one forward's 2 sequences, as single's forwards
    "ep_micro_mb2": {**HYBRID, "dp": {"size": 2}, "ep": {"size": 2}, "data": {"micro_batch_size": 2}, **MICRO},
    "ep_selective": {
        **HYBRID,
        "dp": {"size": 2},
        "ep": {"size": 2},
        "trainer": {**LAST["trainer"], "activation_checkpointing": "selective"},
        **BIAS,
    },
    # regional compile against eager single: the aux loss's gradient and the sharded experts inside compiled blocks
    "ep_compile": {
        **HYBRID,
        "dp": {"size": 2},
        "ep": {"size": 2},
        "trainer": {**LAST["trainer"], "compile": True},
        **BIAS,
    },
    "ep_bf16": {**HYBRID, "dp": {"size": 2}, "ep": {"size": 2}, "trainer": {**LAST["trainer"], **BF16}, **BIAS},
    "single_bf16": {**SINGLE, "trainer": {**LAST["trainer"], **BF16}, **BIAS},
}
REFERENCE = {
    "1f1b": "single_mb2",
    "ep_pp": "ep_ac_full_mb2",
    "ep_ac_full_mb2": "ep_pp",
    "ep_micro_mb2": "single_mb2",
    "ep_bf16": "single_bf16",
}
MODEL = (
    "model=qwen3_moe_debug",
    "model.d_model=64",
    "model.head_dim=32",
    "model.d_ff=192",
    "model.moe_d_ff=64",
)
#: 3 steps: the routing biases move after steps 1 and 2, AdamW runs on a second moment of two steps
STEPS = ("trainer.max_steps=3", "pp.trace_step=0")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return case_multirun(CASES, *MODEL, *FAST, *STEPS, base=tmp_path_factory.mktemp("qwen3_moe"), group="parity_case")


@pytest.fixture(scope="module")
def runs(jobs):
    out = {}
    for case, job in jobs.items():
        metrics = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out[case] = (json.loads((job / "summary.json").read_text()), metrics)
    return out


def test_single_trains_and_reports_the_balance(runs):
    summary, metrics = runs["single"]
    assert summary["final_loss"] < summary["first_loss"] and len(metrics) == 3
    assert all(m["moe_aux_loss"] > 0 and m["moe_max_imbalance"] >= 1.0 for m in metrics)
    assert all(m["moe_dropped_tokens"] == 0 for m in metrics)


def relative_gap(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("single") and not c.endswith("_bf16")])
def test_matches_single(case, runs):
    """Losses, the auxiliary loss and gradient norms per step within ``TOL`` relative of the reference's."""
    ref, metrics = runs[REFERENCE.get(case, "single")][1], runs[case][1]
    assert len(metrics) == len(ref) == 3
    for key in ("loss", "moe_aux_loss", "grad_norm"):
        got, want = [m[key] for m in metrics], [m[key] for m in ref]
        print(case, f"max relative {key} difference", relative_gap(got, want))
        assert_losses_close(got, want, rel=TOL)


def test_the_balance_scope_decides_what_the_router_is_trained_on(runs):
    """dp2 x ep2 with 2 forwards of 2 per rank: the per-micro-batch balance (one forward's 2 sequences) and the global
    one (micro-batch j of both ranks, 4 sequences) differ from step 1 in the auxiliary loss (6.8e-4 relative here;
    the LM loss of step 1 is the same: the weights are); each equals the run it should (``test_matches_single``)."""
    micro, whole = runs["ep_micro_mb2"][1][0], runs["ep_ac_full_mb2"][1][0]
    assert micro["loss"] == pytest.approx(whole["loss"], rel=TOL)
    gap = abs(micro["moe_aux_loss"] - whole["moe_aux_loss"]) / whole["moe_aux_loss"]
    print("micro_batch vs global at step 1: moe_aux_loss", gap)
    assert gap > 100 * TOL, (micro["moe_aux_loss"], whole["moe_aux_loss"])


@pytest.mark.parametrize(
    "case",
    ["ep", "ep_fsdp4", "ep_tp", "tp", "ep_cp", "ep_ac_full_mb2", "ep_micro_mb2", "ep_selective", "ep_compile"],
)
def test_expert_and_tensor_parallel_match_single_to_the_parameters(case, runs, jobs):
    """The final parameters (the experts' DTensor shards read back whole from the checkpoint) and routing biases,
    the tokens per expert (tp ranks' copies counted once); under ep the all-to-all's time and share of the step are
    reported."""
    metrics = runs[case][1]
    run, single = TrainRun(None, jobs[case]), TrainRun(None, jobs[REFERENCE.get(case, "single")])
    worst = assert_parity(run, single, rel=TOL)  # the routing biases (buffers) among them
    print(case, "max parameter difference", worst)
    assert final_state(single)["layers.0.feed_forward.router.expert_bias"].abs().max() > 0  # the bias did move
    load = run.summary()["moe_tokens_per_expert"]
    assert load == single.summary()["moe_tokens_per_expert"] and set(load) == {"layer0", "layer1", "layer2"}
    assert all(sum(v) == 3 * 8 * 32 * 2 for v in load.values())  # steps x samples x tokens x top-k
    assert "moe_imbalance_layer2" in metrics[0]
    if case == "tp":
        return
    assert run.summary()["ep_a2a_time_s_total"] > 0
    assert all(m["ep_a2a_time_s"] > 0 and 0 < m["ep_a2a_fraction"] <= 1 and m["ep_a2a_calls"] > 0 for m in metrics)


def test_bf16_mixed_expert_parallel_matches_bf16_mixed_single(runs):
    """dp2 x ep2 under bf16-mixed (FSDP2's MixedPrecisionPolicy: bf16 rows through the all-to-alls) against single
    under autocast, within bf16 rounding (tests/integration/test_precision_ac_compile_runs.py says why 1e-2): the
    losses, gradient norms and the auxiliary loss. Not the routing (tokens per expert differ from step 2 here) nor
    the parameters (3 AdamW steps of ~lr each: bf16 rounding moves them by up to ~lr)."""
    metrics, ref = runs["ep_bf16"][1], runs["single_bf16"][1]
    for key in ("loss", "grad_norm", "moe_aux_loss"):
        got, want = [m[key] for m in metrics], [m[key] for m in ref]
        print("ep_bf16 max relative", key, "difference", max(abs(a - b) / b for a, b in zip(got, want)))
        assert_losses_close(got, want, rel=BF16_REL)
    for summary in (runs["ep_bf16"][0], runs["single_bf16"][0]):
        assert summary["precision"] == "bf16-mixed"
        assert all(s > 0.5 for s in summary["saved_activation_bf16_share_per_rank"])


def test_expert_parallel_in_a_pipeline_matches_dp_to_the_parameters(jobs, runs):
    """dp2 x ep2 x pp2 (1f1b, 2 micro-batches of 2 samples per rank): each stage's experts split over ep, the balance
    of each micro-batch over both dp ranks' as under dp2 x ep2 accumulating the same forwards."""
    worst = assert_parity(TrainRun(None, jobs["ep_pp"]), TrainRun(None, jobs["ep_ac_full_mb2"]), rel=TOL)
    print("ep_pp max parameter difference", worst)
    metrics, ref = runs["ep_pp"][1], runs["ep_ac_full_mb2"][1]  # the balance over both stages' layers
    for key in ("moe_imbalance_layer0", "moe_imbalance_layer2", "moe_max_imbalance"):
        assert [m[key] for m in metrics] == pytest.approx([m[key] for m in ref], rel=TOL), key
    assert all(0 < m["ep_a2a_fraction"] <= 1 for m in metrics)
    # each step's tokens per expert, both stages' layers, and the run's in the summary
    assert [m["moe_tokens_per_expert"] for m in metrics] == [m["moe_tokens_per_expert"] for m in ref]
    summary, other = runs["ep_pp"][0], runs["ep_ac_full_mb2"][0]
    assert summary["moe_tokens_per_expert"] == other["moe_tokens_per_expert"]
    assert set(summary["moe_tokens_per_expert"]) == {"layer0", "layer1", "layer2"}
    assert all(sum(v) == 3 * 8 * 32 * 2 for v in summary["moe_tokens_per_expert"].values())
    assert summary["moe_imbalance"] == pytest.approx(other["moe_imbalance"]) and summary["ep_a2a_time_s_total"] > 0


@pytest.mark.parametrize("case", ["single", "ep", "ep_pp"])
def test_the_run_draws_its_expert_load_heatmap(case, jobs, runs):
    """One panel per MoE layer (3 here; layer 3 is dense), drawn from metrics.jsonl when the run ends and listed
    among the summary's images (which the W&B sink logs)."""
    png = jobs[case] / FILE
    assert Path(runs[case][0]["artifacts"]["images"][IMAGE]).resolve() == png.resolve() and png.stat().st_size > 0
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == figure_size_px(3)


def test_resumes_under_another_ep_degree(jobs, tmp_path):
    """The dp2 x ep2 run's step-3 checkpoint (4 experts per rank, DTensor shards) continues under dp4 x ep4 (2 per
    rank, one forward of 2: the balance over all 8) as under single: DCP re-shards the experts, the routing biases and AdamW's state."""
    ckpt = jobs["ep"] / "checkpoints" / "step_0000003"
    common = (
        *MODEL,
        *FAST,
        "model.bias_update_rate=0.001",
        "trainer.max_steps=5",
        "trainer.checkpoint_every=0",
        f"trainer.resume={ckpt}",
    )
    single = run_train("parallel=single", *common, run_dir=tmp_path / "single")
    ep4 = run_train(
        "parallel=hybrid", "tp.size=1", "pp.size=1", "dp.size=4", "ep.size=4", *common, run_dir=tmp_path / "ep4"
    )
    assert "resumed from" in ep4.output and [m["step"] for m in ep4.metrics()] == [4, 5]
    assert_losses_close(ep4.losses(), single.losses(), rel=TOL)
    assert_losses_close([m["grad_norm"] for m in ep4.metrics()], [m["grad_norm"] for m in single.metrics()], rel=TOL)
