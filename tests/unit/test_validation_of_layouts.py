"""Bad tensor-parallel / hybrid settings are refused before any worker starts, with the fix named."""

from __future__ import annotations

import pytest

from trainer.validate import ConfigError, validate


def problems(compose_cfg, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides), environ={})
    return str(err.value)


def test_heads_and_widths_must_divide_by_tp(compose_cfg):
    msg = problems(
        compose_cfg,
        "parallel=tp",
        "model.n_heads=3",
        "model.d_model=96",
        "model.d_ff=250",
        "tp.size=4",
        "topology.nproc_per_node=4",
    )
    assert "model.n_heads=3 is not divisible by tp.size=4" in msg
    assert "feed-forward width 250" in msg and "tp.size=4" in msg
    assert "model.d_model=96" not in msg  # 96 divides by 4


def test_d_model_and_sequence_parallel_seq_len(compose_cfg):
    msg = problems(
        compose_cfg,
        "parallel=tp",
        "tp.size=4",
        "model.n_heads=4",
        "model.d_model=130",
        "model.d_ff=128",
        "tp.sequence_parallel=true",
        "data.seq_len=30",
    )
    assert "model.d_model=130 is not divisible by tp.size=4" in msg
    assert "data.seq_len=30 is not divisible by tp.size=4 with tp.sequence_parallel=true" in msg
    assert "use data.seq_len=28 or 32" in msg


def test_tp_needs_a_model_with_a_plan(compose_cfg):
    msg = problems(compose_cfg, "parallel=tp", "model=cnn_bn", "data=images")
    assert "tp.size=2 with model.name=cnn_bn" in msg and "models/tensor_parallel.py" in msg


def test_layers_cover_pipeline_stages(compose_cfg):
    msg = problems(compose_cfg, "parallel=hybrid", "model.n_layers=3", "pp.size=2", "pp.stages_per_rank=2")
    assert "= 4 stages but model.n_layers=3: every stage needs at least one block" in msg


def test_loss_parallel_refused_with_pipeline(compose_cfg):
    msg = problems(compose_cfg, "parallel=hybrid", "tp.loss_parallel=true")
    assert "tp.loss_parallel=true with pp.size=2" in msg


def test_world_size_lists_fitting_factorisations(compose_cfg):
    msg = problems(compose_cfg, "parallel=hybrid", "topology.nproc_per_node=4")
    assert "dp.size=2 x tp.size=2 x pp.size=2 = 8" in msg and "4 workers" in msg
    assert "parallel=hybrid dp.size=2 tp.size=2" in msg  # one of the layouts that fit


def test_batch_divisible_by_dp_times_micro_batches(compose_cfg):
    msg = problems(compose_cfg, "parallel=hybrid", "data.global_batch_size=12", "pp.micro_batches=4")
    assert "pp.micro_batches=4" in msg and "data.global_batch_size=8 or 16" in msg


def test_ddp_with_tp_or_pp_becomes_fsdp_with_its_reason(compose_cfg):
    run = validate(compose_cfg("parallel=hybrid", "dp.shard=false"), environ={})
    assert run.layout.dp_shard
    (warning,) = [w for w in run.warnings if "dp.shard=false" in w]
    assert "aten.cat.default got mixed torch.Tensor and DTensor" in warning
    assert "PipelineStage" in warning
    plain = validate(
        compose_cfg("parallel=hybrid", "pp.size=1", "tp.size=1", "dp.shard=false", "topology.nproc_per_node=2"),
        environ={},
    )
    assert not plain.layout.dp_shard and plain.layout.schedule is None  # pp=1: DDP, no pipeline


def test_each_strategy_lists_the_checks_of_the_dimensions_it_uses():
    """A strategy's rules are its ``StrategySpec.checks``: one that uses tp runs the tensor-parallel checks, one that
    pipelines runs the pipeline checks, and a user's own strategy runs every built-in one."""
    from parallel.assembly.registry import STRATEGIES, checks_for
    from parallel.assembly.strategy_checks import dimension_problems, tensor_parallel_problems
    from parallel.pipeline.checks import fixed_pipeline_problems, pipeline_problems

    for name, spec in STRATEGIES.items():
        if spec.resolved_before_launch:
            continue
        assert ("tp" in spec.dims) == (tensor_parallel_problems in spec.checks), name
        # cp's and ep's own rules, through their rules modules (``MeshDim.rules``)
        assert bool({"cp", "ep"} & set(spec.dims)) == (dimension_problems in spec.checks), name
        assert (spec.pipeline != "never") == (pipeline_problems in spec.checks), name
        assert (spec.fixed_pipeline is not None) == (fixed_pipeline_problems in spec.checks), name
    assert set(checks_for("mine")) == {
        tensor_parallel_problems,
        pipeline_problems,
        fixed_pipeline_problems,
        dimension_problems,
    }


def test_mtp_refused_with_tp_and_cp(compose_cfg):
    """models/mtp.py: the tensor-parallel plan does not split the MTP modules, and a cp rank's chunk lacks the
    targets past its end."""
    mtp = ("model=deepseek_v3_debug", "model.mtp_depth=1")
    assert "model.mtp_depth=1 with tp.size=2" in problems(compose_cfg, *mtp, "parallel=tp")
    hybrid = ("parallel=hybrid", "dp.size=1", "cp.size=2", "tp.size=1", "pp.size=1")
    assert "cp.size=2 with model.mtp_depth=1" in problems(compose_cfg, *mtp, *hybrid)
