"""The model registry: every family's formulas match its built module, validation asks the spec, and the
Llama configs are refused before spawn with the fix. In-process, no workers."""

from __future__ import annotations

import pytest

from models.registry import REGISTRY, model_shape, spec_for
from trainer.validate import ConfigError, validate


def problems(compose_cfg, *overrides: str) -> str:
    with pytest.raises(ConfigError) as exc:
        validate(compose_cfg(*overrides))
    return str(exc.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ("model=gpt_small",),
        ("model=gpt_small", "model.layer_d_ff=[64,128,256,512]"),
        ("model=llama_debug",),
        ("model=llama_debug", "model.n_kv_heads=1", "model.d_ff=0"),
        ("model=llama_debug", "model.tie_embeddings=true"),
    ],
)
def test_formula_counts_the_built_modules_parameters(compose_cfg, overrides):
    from hydra.utils import instantiate

    from models.spec import builder_kwargs

    cfg = compose_cfg(*overrides)
    module = instantiate(builder_kwargs(cfg.model))
    assert model_shape(cfg.model).params == sum(p.numel() for p in module.parameters())


def test_llama3_sizes_are_the_published_ones(compose_cfg):
    published = {"llama3_8b": 8.03e9, "llama3_70b": 70.6e9, "llama3_405b": 405.9e9}
    for name, params in published.items():
        cfg = compose_cfg(f"model={name}")
        shape = model_shape(cfg.model)
        assert shape.params == pytest.approx(params, rel=2e-3), name
        assert shape.n_kv_heads == 8 and shape.vocab_size == 128256 and cfg.model.rope_theta == 500000
        assert spec_for(cfg.model) is REGISTRY["llama"]


def test_planner_plans_llama3_70b_with_whole_kv_heads_per_tp_rank(compose_cfg):
    """On H100 nodes of 16 devices (32 in all: the search is a third of 1024's), tp=16 stays inside a node and splits
    the 64 query heads, not the 8 key/value heads: the planner ranks tp 1, 2, 4 and 8 only, at the published batch."""
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.search import plan

    nodes_of_16 = ("topology.nnodes=2", "topology.nproc_per_node=16", "topology.devices_per_node=16")
    cfg = compose_cfg("model=llama3_70b", "topology=cluster_1024xh100", *nodes_of_16, "planner.recompute=any")
    model, hardware, workload = specs_from_cfg(cfg)
    assert (workload.global_batch_size, workload.seq_len) == (2048, 8192)
    assert hardware.devices_per_node == 16 and model.n_heads % 16 == 0 and not model.tp_divides(16)
    best = plan(model=model, hardware=hardware, workload=workload)
    assert best.ranked and all(8 % e.candidate.tp == 0 for e in best.ranked)
    assert {e.candidate.tp for e in best.ranked} == {1, 2, 4, 8}


def test_kv_heads_must_divide_heads_and_tp(compose_cfg):
    msg = problems(compose_cfg, "model=llama_debug", "model.n_kv_heads=3")
    assert "model.n_kv_heads=3 does not divide model.n_heads=4" in msg and "[1, 2, 4]" in msg
    msg = problems(compose_cfg, "model=llama_debug", "parallel=tp", "tp.size=4", "topology.nproc_per_node=4")
    assert "model.n_kv_heads=2 is not divisible by tp.size=4" in msg and "use tp.size in [1, 2]" in msg
    assert "n_heads=4 is not divisible" not in msg  # 4 query heads split fine over 4 ranks


def test_llama3_8b_is_refused_on_this_machine_with_how_to_plan_it(compose_cfg):
    msg = problems(compose_cfg, "model=llama3_8b")
    assert "model=llama3_8b: 8.03B parameters" in msg and "32.1 GB of fp32 weights" in msg
    assert "python -m parallel.plan model=llama3_8b" in msg


def test_unknown_family_and_spec_are_refused(compose_cfg):
    msg = problems(compose_cfg, "model.family=nope")
    assert "model.family=nope: unknown model family; registered: cnn, " in msg and ", gpt, hf, llama, " in msg
    msg = problems(compose_cfg, "+model.spec=nowhere.mod:SPEC")
    assert "model.spec=nowhere.mod:SPEC: cannot import it" in msg
    assert "model.init_device=gpu: use auto, cpu or meta" in problems(compose_cfg, "model.init_device=gpu")
