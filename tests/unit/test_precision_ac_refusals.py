"""trainer.precision, activation checkpointing and compile: refused before spawn, and checkpointing in-process
(same gradients, less saved memory). The runs are in tests/integration/test_precision_ac_compile_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from trainer.validate import ConfigError, validate


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


# ---- refused before spawn -------------------------------------------------------------------------


def test_precision_and_ac_values_stay_as_users_write_them(compose_cfg):
    """Schema enums (a typo: tests/unit/test_hydra_help_and_choices.py) named by their values, bf16-mixed included,
    built from the one list of each (a new precision is one name in PRECISIONS)."""
    from conf.schema import ActivationCheckpointing, Precision
    from parallel.foundation.checkpointing_modes import AC_MODES
    from parallel.foundation.precision import PRECISIONS
    from trainer.task import resolved_container

    assert Precision.values() == list(PRECISIONS) and ActivationCheckpointing.values() == list(AC_MODES)
    cfg = compose_cfg("trainer.precision=bf16-mixed", "trainer.activation_checkpointing=selective")
    assert cfg.trainer.precision == "bf16-mixed" and f"{cfg.trainer.activation_checkpointing}" == "selective"
    plain = resolved_container(cfg)["trainer"]  # what workers receive: plain strings
    assert (type(plain["precision"]), plain["precision"], plain["activation_checkpointing"]) == (
        str,
        "bf16-mixed",
        "selective",
    )


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
    from models.losses import token_cross_entropy as cross_entropy
    from parallel.foundation.activations import SavedActivationMeter
    from parallel.techniques.checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    model = GPT(n_layers=4, d_model=32, n_heads=2, max_seq_len=32)
    apply_activation_checkpointing(model, mode=mode, every=every)
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


# ---- the planner plans what the trainer runs ----------------------------------------------------------


def test_plan_choice_sets_precision_and_checkpointing(compose_cfg):
    from parallel.plan.api import candidate_of
    from parallel.plan.cost_model import Candidate
    from parallel.plan.search import available_strategies, trainable
    from tests.helpers import CONF
    from trainer.launch.auto import apply_candidate
    from trainer.typed.run_spec import run_spec

    strategies = available_strategies(CONF)
    chosen = Candidate(dp=2, micro_batches=1, zero_stage=3, recompute="selective")
    assert trainable(chosen, strategies) and trainable(Candidate(recompute="full"), strategies)
    cfg = compose_cfg("parallel=auto", "data.global_batch_size=16")
    apply_candidate(cfg, chosen, strategies=strategies, precision="mixed")
    assert cfg.parallel.name == "fsdp"
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.activation_checkpointing == "selective"
    run = validate(cfg, environ={})
    assert candidate_of(run_spec(cfg, run.layout)).recompute == "selective"  # read back as the planner's choice
    apply_candidate(cfg, Candidate(dp=2, recompute="full"), strategies=strategies, precision="fp32")
    assert cfg.trainer.precision == "fp32" and cfg.trainer.activation_checkpointing == "full"
