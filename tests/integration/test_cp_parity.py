"""Context parallel (cp.size, parallel/techniques/cp.py) reproduces parallel=single: losses and gradient norms within
1e-4 relative and the final parameters (read back from the last checkpoint) within 1e-4.

One multirun runs every case as its own job (Python, Hydra and torch start once), Llama (grouped-query attention:
4 query heads, 2 key/value heads) and the GPT (learned positions), each alone and:
- Llama cp2 with full activation checkpointing (the all-to-alls recomputed in backward) and gradient accumulation (4
  micro-batches of 2), FSDP2 over the cp ranks;
- Llama cp2 under bf16-mixed (against bf16-mixed single, within bf16 rounding) and compiled with op-level selective
  checkpointing (against compiled single, selective too; it runs after that in-process compile, so its forked workers
  start from a launcher that compiled). The compiled single run's block (8 x 32 tokens) is the one each rank of
  tests/integration/test_precision_ac_compile_runs.py's compiled fsdp run compiles: the second of the two to compile
  finds inductor's FX graph and kernels in its cache;
- parallel=auto at a memory budget where only cp2 fits the plan (Llama, ZeRO-3 over cp, 8 one-sample micro-batches);
- Llama dp2 x cp2 with DDP over the 4 data ranks (dp.shard=false);
- Llama cp2 x tp2 with sequence parallel (the heads of each tp rank split over cp), FSDP2 over cp;
- Llama cp2 x pp2 under 1F1B, GPipe, interleaved 1F1B (2 stages per rank) and ZBV (a V with a split backward);
- the GPT cp2 with DDP.
Then a run resumes the single run's step-2 checkpoint under cp2 (another cp degree) and continues as single did.
llama_debug at 1024 tokens under cp2 and dp2 x cp2 x pp2 (8 workers) is tests/integration/test_cp_parity_long.py's
multirun (a module of its own: pytest --dist loadfile gives it to the other worker).
Qwen3 (Llama's attention path with per-head q/k norms) trains under cp2 from a transformers folder and exports in
tests/integration/test_hf_init_from_and_export.py.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import (
    FAST,
    TrainRun,
    assert_losses_close,
    assert_parity,
    case_multirun,
    final_state,
    layout_case,
    run_train,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: every job checkpoints its last step (the final parameters compared); single also its step 2 (resumed under cp2)
STEPS = ("trainer.max_steps=4", "pp.trace_step=0")
N_LAYERS = 4


CP2 = {"cp": {"size": 2}}
BF16 = {"precision": "bf16-mixed"}
COMPILE = {"compile": True, "activation_checkpointing": "selective"}
AUTO_CP_MEMORY_GB = 0.0085
CASES: dict[str, dict] = {
    "llama_single": layout_case("llama_debug", "single", trainer={"checkpoint_every": 2}),
    "llama_cp2_ac_full_mb2": layout_case(
        "llama_debug", **CP2, trainer={"activation_checkpointing": "full"}, data={"micro_batch_size": 2}
    ),
    "llama_dp2_cp2_ddp": layout_case("llama_debug", **CP2, dp={"size": 2, "shard": False}),
    "llama_cp2_tp2_sp": layout_case("llama_debug", **CP2, tp={"size": 2, "sequence_parallel": True}),
    "llama_cp2_pp2_1f1b": layout_case("llama_debug", **CP2, pp={"size": 2, "schedule": "1f1b", "micro_batches": 2}),
    "llama_cp2_pp2_gpipe": layout_case("llama_debug", **CP2, pp={"size": 2, "schedule": "gpipe", "micro_batches": 2}),
    "llama_cp2_pp2_interleaved": layout_case(
        "llama_debug", **CP2, pp={"size": 2, "schedule": "interleaved_1f1b", "micro_batches": 4, "stages_per_rank": 2}
    ),
    "llama_cp2_pp2_zbv": layout_case(
        "llama_debug", **CP2, pp={"size": 2, "schedule": "zbv", "micro_batches": 4, "stages_per_rank": 2}
    ),
    "llama_single_bf16": layout_case("llama_debug", "single", trainer=BF16),
    "llama_cp2_bf16": layout_case("llama_debug", **CP2, trainer=BF16),
    "llama_single_compile": layout_case("llama_debug", "single", trainer=COMPILE),
    "llama_cp2_compile": layout_case("llama_debug", **CP2, trainer=COMPILE),
    # parallel=auto where only cp fits: a budget between cp2's planned bytes per rank and every other layout's
    "llama_auto": layout_case("llama_debug", "auto", topology={"device_memory_gb": AUTO_CP_MEMORY_GB}),
    "gpt_single": layout_case("gpt_small", "single"),
    "gpt_cp2_ddp": layout_case("gpt_small", **CP2, dp={"size": 1, "shard": False}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = case_multirun(CASES, *FAST, *STEPS, base=tmp_path_factory.mktemp("cp"), group="cp_case")
    return {name: TrainRun(proc=None, run_dir=job) for name, job in jobs.items()}  # type: ignore[arg-type]


REFERENCE = {"llama_cp2_bf16": "llama_single_bf16", "llama_cp2_compile": "llama_single_compile"}
BF16_REL = 1e-2  # bf16 rounding: tests/integration/test_precision_ac_compile_runs.py says why


def micro_batches(run: TrainRun, layout: dict) -> int:
    """Forwards per step on a rank: the pipeline's micro-batches, or gradient accumulation's."""
    if layout["pp"] > 1:
        return layout["micro_batches"]
    data = yaml.safe_load((run.run_dir / "resolved_config.yaml").read_text())["data"]
    per_rank = data["global_batch_size"] // layout["dp"]
    return per_rank // (data["micro_batch_size"] or per_rank)


@pytest.mark.parametrize("name", [c for c in CASES if "_single" not in c])
def test_matches_single(name, runs):
    run, ref = runs[name], runs[REFERENCE.get(name, name.split("_")[0] + "_single")]
    losses = max(abs(a - b) / abs(b) for a, b in zip(run.losses(), ref.losses()))
    norms = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(run.metrics(), ref.metrics()))
    summary = json.loads((run.run_dir / "summary.json").read_text())
    if name.endswith("_bf16"):  # bf16 parameters after 4 AdamW steps differ by rounding up to ~lr: not compared
        print(f"{name}: max relative difference loss {losses:.1e}, grad norm {norms:.1e}")
        assert_losses_close(run.losses(), ref.losses(), rel=BF16_REL)
        assert_losses_close(
            [m["grad_norm"] for m in run.metrics()], [m["grad_norm"] for m in ref.metrics()], rel=BF16_REL
        )
        assert summary["precision"] == "bf16-mixed" and all(
            s > 0.5 for s in summary["saved_activation_bf16_share_per_rank"]
        )
    else:
        worst = assert_parity(run, ref)
        print(
            f"{name}: max relative difference loss {losses:.1e}, grad norm {norms:.1e}; max parameter difference {worst:.1e}"
        )
    layout = summary["layout"]
    assert layout["cp"] == 2 and layout["world_size"] == 2 * layout["dp"] * layout["tp"] * layout["pp"]
    if name.endswith("_compile"):  # compiled blocks keep the traceable all-to-all, untimed
        assert summary["compile"] is True and summary["compile_time_s"] > 0
        return
    # the all-to-alls timed on every logged step: 8 per block (q, k, v and the output; forward and backward), 4 more
    # per block recomputed under full checkpointing, per micro-batch, over the blocks this rank holds
    per_block = 12 if "ac_full" in name else 8
    micro = micro_batches(run, layout)
    blocks = N_LAYERS // layout["pp"]
    for m in run.metrics():
        assert 0 < m["cp_comm_fraction"] < 1, (name, m)
        if m["step"] > 1 or layout["pp"] == 1:  # a pipeline's first step also runs its stages' shape inference
            assert m["cp_collectives"] == per_block * blocks * micro, (name, m)
    assert 0 < summary["cp_comm_fraction_median"] < 1 and summary["cp_comm_time_s_median"] > 0


def test_auto_trains_its_cp_choice(runs):
    """parallel=auto at a memory budget that only cp2 (ZeRO-3 over the cp ranks, 1-sample micro-batches) fits: the
    plan's layout is what trained (8 micro-batches of one sample accumulated per step, as planned)."""
    run = runs["llama_auto"]
    layout = run.summary()["layout"]
    assert (layout["strategy"], layout["cp"], layout["dp"], layout["dp_shard"]) == ("hybrid", 2, 1, True), layout
    assert micro_batches(run, layout) == 8
    asked = yaml.safe_load((run.run_dir / ".hydra" / "config.yaml").read_text())["parallel"]["name"]
    trained = yaml.safe_load((run.run_dir / "resolved_config.yaml").read_text())["parallel"]["name"]
    assert (asked, trained) == ("auto", "hybrid")


def test_resumes_single_checkpoint_under_cp2(runs, tmp_path):
    """Checkpoints keep the full model's names: single's step-2 checkpoint continues under cp2 as single did."""
    ref = runs["llama_single"]
    checkpoint = ref.run_dir / "checkpoints" / "step_0000002"
    assert checkpoint.is_dir()
    resumed = run_train(
        "parallel=hybrid",
        "model=llama_debug",
        "dp.size=1",
        "tp.size=1",
        "pp.size=1",
        "cp.size=2",
        *FAST,
        *STEPS,
        f"trainer.resume={checkpoint}",
        run_dir=tmp_path / "resumed",
    )
    assert [m["step"] for m in resumed.metrics()] == [3, 4]
    assert_losses_close(resumed.losses(), ref.losses()[2:], rel=1e-4)
    a, b = final_state(resumed), final_state(ref)
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in b)
    print(f"resumed under cp2: max parameter difference at step 4 {worst:.1e}")
    assert worst <= 1e-4
