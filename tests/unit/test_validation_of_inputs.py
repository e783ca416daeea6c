"""Bad input is refused before any worker starts, with the key, the value and a fix in the message."""

from __future__ import annotations

import pytest

from trainer.validate import ConfigError, validate


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


def test_world_size_mismatch_lists_fitting_layouts(compose_cfg):
    msg = _problems(compose_cfg("dp.size=4", "topology.nproc_per_node=2"))
    assert "dp.size=4 x tp.size=1 x pp.size=1 = 4" in msg
    assert "topology.nproc_per_node=2 = 2 workers" in msg
    for layout in (
        "parallel=ddp dp.size=2 tp.size=1",
        "parallel=tp dp.size=1 tp.size=2",
        "parallel=pp dp.size=1 tp.size=1",
    ):
        assert layout in msg  # every degree named: a parallel= option's own degrees would change the world size
    assert "topology.nproc_per_node=4" in msg


def test_nproc_follows_layout_when_unset(compose_cfg):
    run = validate(compose_cfg("dp.size=3", "data.global_batch_size=12"), environ={})
    assert run.layout.nproc_per_node == 3 and run.layout.world_size == 3


def test_global_batch_not_divisible_by_dp(compose_cfg):
    msg = _problems(compose_cfg("data.global_batch_size=15"))
    assert "data.global_batch_size=15 is not divisible by dp.size=2" in msg
    assert "data.global_batch_size=14 or 16" in msg


def test_micro_batch_must_divide_replica_batch(compose_cfg):
    msg = _problems(compose_cfg("data.global_batch_size=16", "data.micro_batch_size=3"))
    assert "data.micro_batch_size=3 does not divide the 8 samples per replica" in msg


@pytest.mark.parametrize(
    "key",
    [
        "dp.size",
        "data.global_batch_size",
        "data.seq_len",
        "trainer.max_steps",
        "trainer.measure_every",
        "pp.micro_batches",
        "topology.nnodes",
    ],
)
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_sizes(compose_cfg, key, value):
    msg = _problems(compose_cfg(f"{key}={value}"))
    assert f"{key}={value}: must be a positive integer" in msg


def test_dp_with_several_workers(compose_cfg):
    msg = _problems(compose_cfg("parallel=dp", "topology.nproc_per_node=2"))
    assert "parallel=dp with 2 workers" in msg and "use parallel=ddp" in msg


def test_dp_size_with_legacy_dp(compose_cfg):
    msg = _problems(compose_cfg("parallel=dp", "dp.size=2"))
    assert "dp.size=2 with parallel=dp" in msg and "parallel=ddp" in msg


def test_strategy_rejects_foreign_dimension(compose_cfg):
    msg = _problems(compose_cfg("parallel=ddp", "tp.size=2", "topology.nproc_per_node=4"))
    assert "tp.size=2 with parallel=ddp" in msg and "parallel=hybrid" in msg


def test_missing_data_path(compose_cfg, tmp_path):
    missing = tmp_path / "nope.txt"
    msg = _problems(compose_cfg(f"data.path={missing}"))
    assert f"data.path={missing}: no such file" in msg


def test_seq_len_beyond_model(compose_cfg):
    msg = _problems(compose_cfg("data.seq_len=256", "model.max_seq_len=128"))
    assert "data.seq_len=256 exceeds model.max_seq_len=128" in msg


def test_sync_batchnorm_on_cpu(compose_cfg):
    msg = _problems(compose_cfg("dp.sync_batchnorm=true"))
    assert "SyncBatchNorm runs on CUDA only" in msg


def test_all_problems_reported_at_once(compose_cfg):
    err = pytest.raises(
        ConfigError, validate, compose_cfg("data.global_batch_size=15", "topology.backend=nccl"), environ={}
    )
    assert len(err.value.problems) == 2


def test_torchrun_world_size_checked(compose_cfg):
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    with pytest.raises(
        ConfigError,
        match="dp.size=2 x tp.size=1 x pp.size=1 = 2 but topology.nnodes=1 x topology.nproc_per_node=4 = 4 workers",
    ):
        validate(compose_cfg(), environ=env)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=-1", "optim.lr=-1.0: must be a number >= 0"),
        ("optim.lr=nan", "optim.lr=nan: must be a number >= 0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1: must be >= 0"),
        ("optim.betas=[1.0,0.9]", "optim.betas=[1.0, 0.9]: must be two numbers in [0, 1)"),
        ("optim.betas=[0.9]", "optim.betas=[0.9]: must be two numbers in [0, 1)"),
        ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio=1.5: must be in [0, 1]"),
        ("model=cnn_bn", "model=cnn_bn with data=text: the model reads images, the data are token sequences"),
        ("data=images", "model=gpt_small with data=images: the model reads token sequences"),
        ("trainer.grad_clip=nan", "trainer.grad_clip=nan: must be a number"),
        ("dp.bucket_cap_mb=0", "dp.bucket_cap_mb=0.0: must be null (torch's default) or a number of MiB > 0"),
        ("model.layer_d_ff=[64,64]", "model.layer_d_ff=[64, 64]: 2 width(s) for model.n_layers=4"),
        ("trainer.objective=loss", "trainer.objective=loss: not a summary.json number; use one of tokens_per_s"),
        ("topology.node_rank=5", "topology.node_rank=5 with topology.nnodes=1: node ranks run 0..0"),
    ],
)
def test_what_a_worker_would_reject_is_refused(compose_cfg, override, expected):
    assert expected in _problems(compose_cfg(override))


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ("parallel=fsdp", "optim=sgd", "optim.implementation=fused"),
            "optim.implementation=fused: torch shards the fused kernel of Adam, AdamW only, and this run's SGD "
            "updates DTensor parameters (FSDP2 or TP); use optim.implementation=auto or foreach",
        ),
        (("parallel=tp", "optim=sgd", "optim.implementation=fused"), "this run's SGD updates DTensor parameters"),
        (
            ("optim._target_=torch.optim.RMSprop", "optim.implementation=fused"),
            "optim.implementation=fused: RMSprop takes no `fused` argument; use optim.implementation=auto or for-loop",
        ),
        (("optim._target_=torch.optim.LBFGS", "optim.implementation=foreach"), "LBFGS takes no `foreach` argument"),
        (
            ("optim._target_=torch.optim.NoSuchOptimizer", "optim.implementation=fused"),
            "optim._target_=torch.optim.NoSuchOptimizer: cannot be imported",
        ),
    ],
)
def test_an_optimizer_kernel_the_class_or_layout_lacks_is_refused(compose_cfg, overrides, expected):
    assert expected in _problems(compose_cfg(*overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ("parallel=ddp", "optim=sgd", "optim.implementation=fused"),  # plain tensors: SGD's fused kernel runs
        ("parallel=fsdp", "optim.implementation=fused"),  # AdamW's fused kernel over DTensors
        ("parallel=tp", "optim=sgd", "optim.implementation=foreach"),
        ("parallel=fsdp", "optim=sgd", "optim.implementation=fused", "+optim.fused=false"),  # its own argument wins
    ],
)
def test_an_optimizer_kernel_the_class_and_layout_have_is_accepted(compose_cfg, overrides):
    validate(compose_cfg(*overrides), environ={})


def test_grad_clip_off_values_are_accepted(compose_cfg):
    for value in ("0", "-1", "inf"):
        validate(compose_cfg(f"trainer.grad_clip={value}"), environ={})


def test_multi_node_contradictions(compose_cfg):
    import socket

    msg = _problems(compose_cfg("topology=multi_node", "topology.node_rank=2"))
    assert "topology.node_rank=2 with topology.nnodes=2: node ranks run 0..1" in msg
    msg = _problems(compose_cfg("topology=multi_node", "topology.master_addr=no-such-host.invalid"))
    assert "topology.master_addr=no-such-host.invalid: this host name does not resolve" in msg
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        msg = _problems(compose_cfg("topology=multi_node", f"topology.master_port={port}"))
        assert f"topology.master_port={port}: the port is in use on this host" in msg
        # a node other than 0 only connects to the port: that is not a contradiction
        validate(compose_cfg("topology=multi_node", f"topology.master_port={port}", "topology.node_rank=1"), environ={})


@pytest.mark.parametrize(
    "model, rule",
    [
        ("gpt_small", "0 means 4 * model.d_model"),
        ("llama_debug", "0 means Llama's rule"),
        ("qwen3_debug", "0 means Llama's rule"),
    ],
)
def test_each_family_answers_with_its_own_rule(compose_cfg, model, rule):
    """The family's spec checks its sizes (no key guesses the family): a Llama's d_ff gets Llama's default."""
    msg = _problems(compose_cfg(f"model={model}", "model.d_ff=-1"))
    assert f"model.d_ff=-1: must be >= 0 ({rule}" in msg


def test_zero_learning_rate_is_accepted_with_a_warning(compose_cfg):
    """optim.lr=0 is what a round trip or a timing run asks for: torch accepts it, so validation does, and says
    the weights will not change."""
    validated = validate(compose_cfg("optim.lr=0"), environ={})
    assert any("optim.lr=0: the weights will not change" in w for w in validated.warnings), validated.warnings
    assert not any("optim.lr" in w for w in validate(compose_cfg("optim.lr=1e-3"), environ={}).warnings)


@pytest.mark.parametrize("objective", ["val_loss", "best_val_loss", "val_ppl"])
def test_validation_objectives_are_accepted_with_an_evaluation_and_named_without(compose_cfg, objective):
    """hparams_search=val_loss's objective: one list (trainer/checks/run.py) for the check and the sweeps."""
    validate(compose_cfg(f"trainer.objective={objective}", "trainer.eval_every=2"), environ={})
    problems = _problems(compose_cfg(f"trainer.objective={objective}", "trainer.eval_every=0"))
    assert f"trainer.objective={objective} needs an evaluation: set trainer.eval_every" in problems
