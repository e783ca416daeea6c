"""trainer.precision=fp8 through the command line, on CPU under torchao's emulation (the float8 casts and dynamic
scales of real fp8, the matmul on the dequantised values): losses against bf16-mixed under single and fsdp (FSDP2's
float8 all-gather, the scales precomputed after each optimizer step), FSDP2 over tensor parallel with torchao's float8
styles and a pipeline against fp8 single, and an fsdp run resumed from its checkpoint.

Tolerance. fp8 is bf16-mixed whose block projections multiply e4m3 values (3 mantissa bits: an element rounds by up
to 2^-4 relative, where bf16 rounds by 2^-9). Measured here (llama_debug, batch 8 x 32 tokens, AdamW, 12 steps; the
largest relative difference of a step's loss): fp8 single from bf16-mixed single 1.1e-3, fsdp 1.2e-3 (6.2e-4 from
fp8 single), ddp 4.8e-4, dp2 x tp2 8.0e-4 and pp2 3.6e-4 from fp8 single, rowwise tp2 4.3e-4 from bf16-mixed; the loss falls from 6.07 to 3.75. The tests run the first 10 of those
steps (the same steps: the 10-step warm-up does not depend on trainer.max_steps), where fp8 single falls to 3.83. FP8_REL is the bf16
tests' 1e-2 (tests/integration/test_precision_ac_compile_runs.py, whose docstring says why), 8x the largest seen; that
float8 did change the numbers is asked on its own (not equal to bf16-mixed's; tests/unit/test_fp8.py measures the
matmul's rounding), and that the loss falls as far as bf16-mixed's.
"""

from __future__ import annotations

import pytest

from tests.helpers import FAST, assert_losses_close, run_train

pytestmark = pytest.mark.slow

#: llama_debug: d_model 128, kv width 64, d_ff 384: every projection's dims are multiples of 16 (and of 32, tp=2)
MODEL = ("model=llama_debug",)
STEPS = ("trainer.max_steps=10",)
FP8 = ("trainer.precision=fp8",)
#: untimed FSDP2 collectives: meshtrain's float8-safe all-gather without the timer (dp2_tp2 below runs the timed one)
FSDP = ("parallel=fsdp", "dp.size=2", "dp.measure_comm=false")
#: 4 blocks x 7 projections; the head (vocabulary 256) stays bf16
CONVERTED = "28 of 29 Linears converted to Float8Linear; kept in high precision: ['output']"
FP8_REL = 1e-2


@pytest.fixture(scope="module")
def mixed_single(reference):
    return reference(*MODEL, *FAST, *STEPS, "trainer.checkpoint_every=0", "trainer.precision=bf16-mixed")


@pytest.fixture(scope="module")
def fp8_single(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8") / "run"
    return run_train("parallel=single", *MODEL, *FAST, *STEPS, *FP8, "trainer.checkpoint_every=0", run_dir=folder)


def _falls_like(run, reference) -> None:
    losses, ref = run.losses(), reference.losses()
    assert losses[-1] < 0.8 * losses[0], losses
    assert losses[0] - losses[-1] > 0.8 * (ref[0] - ref[-1]), (losses, ref)


def test_fp8_single_follows_bf16_mixed(fp8_single, mixed_single):
    assert CONVERTED in fp8_single.output and "fp8 (tensorwise, emulated)" in fp8_single.output
    assert fp8_single.summary()["precision"] == "fp8"
    assert_losses_close(fp8_single.losses(), mixed_single.losses(), rel=FP8_REL)
    assert fp8_single.losses() != mixed_single.losses()  # the float8 casts did change the numbers
    _falls_like(fp8_single, mixed_single)


@pytest.fixture(scope="module")
def fp8_fsdp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp8_fsdp") / "run"
    return run_train(*FSDP, *MODEL, *FAST, *STEPS, *FP8, "trainer.checkpoint_every=6", run_dir=folder)


def test_fp8_fsdp_float8_all_gather_follows_bf16_mixed(fp8_fsdp, fp8_single, mixed_single):
    assert "fp8 (tensorwise, emulated, float8 all-gather)" in fp8_fsdp.output
    assert_losses_close(fp8_fsdp.losses(), mixed_single.losses(), rel=FP8_REL)
    assert_losses_close(fp8_fsdp.losses(), fp8_single.losses(), rel=FP8_REL)
    _falls_like(fp8_fsdp, mixed_single)


def test_fp8_fsdp_resumes_from_its_checkpoint(fp8_fsdp, tmp_path):
    """The float8 weights' wrappers (FSDP2's float8 all-gather) save and load under the plain names: a run started
    from the step-6 checkpoint continues as the uninterrupted one, bit for bit (the first step after the load
    computes the weights' scales in its forward, as step 1 did, and gets the same ones)."""
    ckpt = fp8_fsdp.run_dir / "checkpoints" / "step_0000006"
    resumed = run_train(
        *FSDP,
        *MODEL,
        *FAST,
        *FP8,
        "trainer.max_steps=9",
        "trainer.checkpoint_every=0",
        f"trainer.resume={ckpt}",
        run_dir=tmp_path / "run",
    )
    assert "resumed from" in resumed.output
    assert [m["step"] for m in resumed.metrics()] == [7, 8, 9]
    tail = fp8_fsdp.metrics()[6:9]
    assert [(m["loss"], m["grad_norm"]) for m in resumed.metrics()] == [(m["loss"], m["grad_norm"]) for m in tail]


#: layouts against fp8 single: DDP (autocast, float8 weights all-reduced as fp32 gradients), FSDP2 over tensor parallel (2-D shards: torchao's float8 TP styles and the float8
#: all-gather of DTensor weights), a pipeline (each stage converted on its own); rowwise under tensor parallel (torch's
#: styles, communication in bf16) against bf16-mixed (its scales are not tensorwise's)
LAYOUTS = {
    "ddp": ("parallel=ddp", "dp.size=2"),
    "dp2_tp2": ("parallel=hybrid", "pp.size=1", "dp.size=2", "tp.size=2"),
    "pp2": ("parallel=pp", "pp.size=2", "pp.micro_batches=2", "pp.schedule=1f1b"),
    "tp2_rowwise": ("parallel=tp", "tp.size=2", "trainer.fp8.recipe=rowwise"),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_fp8_layouts_follow_single(name, fp8_single, mixed_single, tmp_path):
    run = run_train(*LAYOUTS[name], *MODEL, *FAST, *STEPS, *FP8, "trainer.checkpoint_every=0", run_dir=tmp_path / "run")
    assert_losses_close(run.losses(), (mixed_single if "rowwise" in name else fp8_single).losses(), rel=FP8_REL)
    if name == "dp2_tp2":
        assert "torchao's float8 styles" in run.output and "float8 all-gather)" in run.output
    elif name == "pp2":  # each stage converts its own blocks (2 x 7 projections); the last stage keeps its head
        logs = [(run.run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1)]
        assert "14 of 14 Linears converted" in logs[0] and "14 of 15 Linears converted" in logs[1]
    elif name == "tp2_rowwise":
        assert "fp8 (rowwise, emulated)" in run.output and "float8 styles" not in run.output
        _falls_like(run, mixed_single)
