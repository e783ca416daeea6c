"""trainer.callbacks checked before any worker starts (each entry's class imports and takes its arguments), and the
fault injection the reliability tests pass as callbacks (tests/faults.py): gone from the product's config, each
fault's hook doing what the tests rely on."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from tests.faults import FailAt, KillAt, NaNAt, WaitAt, inject
from trainer.validate import ConfigError, validate


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


def test_fault_injection_keys_are_gone_from_the_job_config(compose_cfg):
    """The job config ``python train.py --cfg job`` prints (Hydra's own keys aside), composed in process."""
    from omegaconf import OmegaConf

    job = OmegaConf.to_yaml(compose_cfg())
    assert "trainer:" in job and "callbacks: []" in job
    for word in ("debug", "_at_step", "crash", "fault", "wait_file"):
        assert word not in job, word


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "trainer.callbacks=[{path:x}]",
            "trainer.callbacks[0]={'path': 'x'}: names no class; give a mapping with _target_: module.Class",
        ),
        (
            "trainer.callbacks=[{_target_:no_such_module.Callback}]",
            "trainer.callbacks[0]._target_=no_such_module.Callback: cannot be imported (ModuleNotFoundError: No "
            "module named 'no_such_module'); name a class as module.Class, its module importable where train.py runs",
        ),
        (
            "trainer.callbacks=[{_target_:tests.recording_callback.Recorder,path:x},{_target_:tests.faults.NoSuch}]",
            "trainer.callbacks[1]._target_=tests.faults.NoSuch: cannot be imported (",
        ),
        (
            "trainer.callbacks=[{_target_:tests.faults.WAIT_MAX_S}]",
            "trainer.callbacks[0]._target_=tests.faults.WAIT_MAX_S: a float, not a class",
        ),
        (
            "trainer.callbacks=[{_target_:tests.faults.KillAt,stepp:3}]",
            "trainer.callbacks[0]: tests.faults.KillAt takes no argument stepp; it takes: step, rank",
        ),
        (
            "trainer.callbacks=[{_target_:tests.faults.KillAt,rank:1}]",
            "trainer.callbacks[0]: tests.faults.KillAt(rank=1): missing a required argument: 'step'; it takes: step, "
            "rank",
        ),
        (
            inject(KillAt, step=3, rank=5),
            "trainer.callbacks[0]: KillAt(rank=5): no such rank; the job has ranks 0..1",
        ),
        (inject(FailAt, step=0), "trainer.callbacks[0]: FailAt(step=0): the step must be an integer >= 1"),
    ],
)
def test_a_callback_entry_that_would_fail_in_the_workers_is_refused(compose_cfg, override, expected):
    assert expected in _problems(compose_cfg(override))


def test_faults_compose_and_validate(compose_cfg, tmp_path):
    cfg = compose_cfg(inject(KillAt, step=3, rank=1))
    assert dict(cfg.trainer.callbacks[0]) == {"_target_": "tests.faults.KillAt", "step": 3, "rank": 1}
    validate(cfg, environ={})
    cfg = compose_cfg(inject(WaitAt, step=3, file=tmp_path / "go"))
    assert cfg.trainer.callbacks[0].file == str(tmp_path / "go")
    validate(cfg, environ={})


# ---- what each fault does, on a stand-in trainer --------------------------------------------------


def _trainer(rank: int, params=()):
    ctx = SimpleNamespace(rank=rank, log=logging.getLogger("faults"))
    return SimpleNamespace(ctx=ctx, engine=SimpleNamespace(parameters=lambda: list(params)), preemption=None)


def test_fail_raises_at_its_step_on_its_rank_in_every_attempt(monkeypatch):
    fault = FailAt(step=3, rank=1)
    fault.on_step_start(_trainer(0), step=3)
    fault.on_step_start(_trainer(1), step=2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with pytest.raises(RuntimeError, match="injected failure at step 3 on rank 1"):
        fault.on_step_start(_trainer(1), step=3)


def test_nan_poisons_the_loss_and_one_gradient_in_the_first_attempt_only(monkeypatch):
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    for p in params:
        p.grad = torch.ones(2)
    loss = torch.tensor(1.5)
    NaNAt(step=4, rank=1).on_after_backward(_trainer(0, params), step=4, loss=loss)
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in params)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    NaNAt(step=4, rank=1).on_after_backward(_trainer(1, params), step=4, loss=loss)
    assert torch.isfinite(loss)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    NaNAt(step=4, rank=1).on_after_backward(_trainer(1, params), step=4, loss=loss)
    assert torch.isnan(loss) and torch.isnan(params[0].grad).all() and torch.isfinite(params[1].grad).all()


@pytest.mark.timeout(60)
def test_wait_holds_until_a_stop_signal_or_its_file(tmp_path):
    go = tmp_path / "go"
    trainer = _trainer(0)
    trainer.preemption = SimpleNamespace(requested=True)
    WaitAt(step=3, file=str(go)).on_step_start(trainer, step=3)  # a stop signal came: no wait
    trainer.preemption.requested = False
    go.touch()
    WaitAt(step=3, file=str(go)).on_step_start(trainer, step=3)  # the file exists: no wait either
