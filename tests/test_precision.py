"""trainer.precision, activation checkpointing, compile, MFU/memory and profiling, through the real command line.

bf16 tolerance. bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 ≈ 2e-3 relative. A strategy
and the single-process reference round at different places (FSDP2's MixedPrecisionPolicy runs the norms in
bf16 where autocast keeps them in fp32; gradients are summed in another order and all-reduced in fp32;
tensor parallel splits every matmul's reduction), so their losses drift apart by a few roundings over 20
AdamW steps. Measured here over 20 steps: at most 1.7e-3 relative (fsdp), 1.1e-3 (tp), 7e-4 (ddp, pp),
6e-4 (hybrid). The test allows 1e-2 (about 2.5 bf16 units in the last place, 6x the largest drift seen): loose
enough for other CPUs' kernels, tight enough to catch a wrong reduction (a gradient not averaged over 2
replicas moves the loss by more than 10% within a few steps). Whether a run really computed in bf16 is
checked on its own: the share of bytes saved for backward in bf16 (0 in fp32).
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import FAST, assert_losses_close, run_train
from trainer.validate import ConfigError, validate

BF16_REL = 1e-2
STEPS20 = ("trainer.max_steps=20", "trainer.checkpoint_every=0")
MIXED = ("trainer.precision=bf16-mixed",)


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


# ---- refused before spawn -------------------------------------------------------------------------


def test_unknown_precision_and_ac_mode_refused(compose_cfg):
    msg = _problems(compose_cfg("trainer.precision=fp16", "trainer.activation_checkpointing=some"))
    assert "trainer.precision=fp16: unknown precision; use one of fp32, bf16-mixed, bf16" in msg
    assert "loss scaler" in msg
    assert "trainer.activation_checkpointing=some: unknown mode; use one of none, full, selective" in msg


def test_ac_every_and_profile_steps_refused(compose_cfg):
    msg = _problems(
        compose_cfg(
            "trainer.activation_checkpointing=full",
            "trainer.ac_every=2",
            "trainer.max_steps=5",
            "trainer.profile_steps=[4,9]",
        )
    )
    assert "trainer.ac_every=2 with trainer.activation_checkpointing=full" in msg
    assert "use trainer.activation_checkpointing=selective" in msg
    assert "trainer.profile_steps=[4, 9]" in msg and "trainer.max_steps=5" in msg


def test_compile_without_compiler_refused(compose_cfg, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    msg = _problems(compose_cfg("trainer.compile=true", "topology.device=cpu"))
    assert "trainer.compile=true on CPU needs a C++ compiler" in msg and "trainer.compile=false" in msg


# ---- activation checkpointing in-process: same gradients, less saved memory -------------------------


def _grads_and_saved(mode: str, every: int = 1) -> tuple[dict[str, torch.Tensor], int]:
    from models.gpt.model import GPT
    from parallel.core.activations import SavedActivationMeter
    from parallel.core.base import cross_entropy
    from parallel.core.regional import prepare_module

    torch.manual_seed(0)
    model = GPT(n_layers=4, d_model=64, n_heads=4, max_seq_len=32)
    trainer = OmegaConf.create({"activation_checkpointing": mode, "ac_every": every, "precision": "fp32"})
    prepare_module(model, trainer=trainer, device_type="cpu", autocast=True)
    x = torch.randint(0, 256, (4, 32))
    meter = SavedActivationMeter()
    with meter.step():
        cross_entropy(model(x[:, :-1]), x[:, 1:]).backward()
    assert meter.live == 0  # everything saved was released by backward
    return {n: p.grad.clone() for n, p in model.named_parameters()}, meter.peak


def test_activation_checkpointing_same_gradients_less_memory():
    ref, none = _grads_and_saved("none")
    peaks = {"none": none}
    for mode, every in (("full", 1), ("selective", 1), ("selective", 2)):
        grads, peaks[f"{mode}{every}"] = _grads_and_saved(mode, every)
        assert grads.keys() == ref.keys()  # names kept
        for name in ref:
            torch.testing.assert_close(grads[name], ref[name], rtol=1e-5, atol=1e-7)
    assert peaks["full1"] < peaks["selective1"] < peaks["none"], peaks
    assert peaks["full1"] < peaks["selective2"] < peaks["none"], peaks


# ---- runs ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_single(tmp_path_factory):
    return run_train("parallel=single", *FAST, *STEPS20, *MIXED, run_dir=tmp_path_factory.mktemp("single") / "run")


STRATEGY_RUNS = {
    "ddp": ("parallel=ddp", "trainer.activation_checkpointing=selective"),
    "fsdp": ("parallel=fsdp", "dp.size=2", "trainer.activation_checkpointing=full"),
    "tp": ("parallel=tp", "tp.size=2"),
    "pp": ("parallel=pp", "pp.size=2", "pp.micro_batches=2", "trainer.activation_checkpointing=selective"),
    "mp": ("parallel=mp", "pp.size=2", "trainer.activation_checkpointing=full"),
    "hybrid": (
        "parallel=hybrid",
        "dp.size=2",
        "pp.size=2",
        "pp.micro_batches=2",
        "trainer.activation_checkpointing=selective",
        "trainer.ac_every=2",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STRATEGY_RUNS))
def test_bf16_mixed_matches_single(name, mixed_single, tmp_path):
    run = run_train(*STRATEGY_RUNS[name], *FAST, *STEPS20, *MIXED, run_dir=tmp_path / "run")
    assert_losses_close(run.losses(), mixed_single.losses(), rel=BF16_REL)
    assert mixed_single.losses()[-1] < 0.7 * mixed_single.losses()[0]
    summary = run.summary()
    world = summary["layout"]["world_size"]
    assert summary["precision"] == "bf16-mixed"
    shares = summary["saved_activation_bf16_share_per_rank"]
    assert len(shares) == world and all(s > 0.5 for s in shares), shares
    saved = summary["peak_saved_activation_bytes_per_rank"]
    assert len(saved) == world and all(b > 0 for b in saved), saved
    assert 0 < summary["mfu"] < 1 and summary["model_flops_per_token"] > 0
    for m in run.metrics():
        assert 0 < m["mfu"] < 1 and m["memory_rss_bytes"] > 10 * 2**20 and m["saved_activation_bytes"] > 0


@pytest.mark.slow
def test_ac_saved_activations_full_lt_selective_lt_none(tmp_path):
    """The same run config under each mode: the measured peak in summary.json orders as it must, the
    losses are the same (recomputation is exact), and the fp32 run saves nothing in bf16. The
    ``none`` run also profiles steps 2..3."""
    runs = {}
    for mode in ("none", "selective", "full"):
        extra = ("trainer.profile_steps=[2,3]",) if mode == "none" else ()
        runs[mode] = run_train(
            "parallel=single",
            *FAST,
            "trainer.max_steps=3",
            f"trainer.activation_checkpointing={mode}",
            *extra,
            run_dir=tmp_path / mode,
        )
    peak = {m: r.summary()["peak_saved_activation_bytes_max"] for m, r in runs.items()}
    assert peak["full"] < peak["selective"] < peak["none"], peak
    for mode in ("selective", "full"):
        assert_losses_close(runs[mode].losses(), runs["none"].losses(), rel=1e-6)
    summary = runs["none"].summary()
    assert summary["saved_activation_bf16_share_per_rank"] == [0.0]
    trace = tmp_path / "none" / "profile" / "rank0.trace.json"
    assert str(trace) in summary["profile_files"] and str(trace) in summary["artifacts"]["files"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("aten::mm" in e.get("name", "") for e in events)


@pytest.mark.slow
def test_pure_bf16_trains(tmp_path):
    run = run_train("parallel=ddp", *FAST, "trainer.max_steps=8", "trainer.precision=bf16", run_dir=tmp_path / "run")
    losses = run.losses()
    assert losses[-1] < 0.85 * losses[0]
    assert all(s > 0.9 for s in run.summary()["saved_activation_bf16_share_per_rank"])
