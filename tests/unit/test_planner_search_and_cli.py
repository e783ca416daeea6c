"""The planner and its command line: big models plan fast and fit, slow links push dp inside nodes."""

from __future__ import annotations

import json

import pytest

from parallel.foundation.layout import ParallelLayout
from parallel.plan.api import layout_warnings
from parallel.plan.cli import CONF, main, specs_from_cfg
from parallel.plan.cost_model import Candidate
from parallel.plan.search import (
    available_strategies,
    plan,
    strategy_of,
)
from parallel.plan.specs import PlanError
from tests.planning import plan_cli_composes_once
from trainer.launch.auto import apply_candidate
from trainer.typed.planner_request import planner_request
from trainer.typed.run_spec import run_spec
from trainer.validate import ConfigError, validate

ROOT = CONF.parent


@pytest.fixture(scope="module")
def searched():
    """The plans this module's searches made, by their inputs: gpt_175b on 1024 H100s is searched once for the test
    that ranks it and the command line's JSON (``planned``; ``main`` through ``remembering``)."""
    return {}


def planned(searched: dict, **inputs):
    key = repr(inputs)
    if key not in searched:
        searched[key] = plan(**inputs)
    return searched[key]


@pytest.fixture
def remembering(searched, monkeypatch):
    """``python -m parallel.plan``'s ``main`` searching through ``planned``, composing through the session's
    compositions (``plan_cli_composes_once``)."""
    from parallel.plan import cli

    monkeypatch.setattr(cli, "plan", lambda **inputs: planned(searched, **inputs))
    plan_cli_composes_once(monkeypatch)


@pytest.mark.parametrize(
    "model,topology", [("gpt_175b", "cluster_1024xh100"), ("gpt_70b", "cluster_1024xh100"), ("gpt_7b", "gpu_node")]
)
def test_big_model_plans_fast_and_fits(compose_cfg, searched, model, topology):
    cfg = compose_cfg(f"model={model}", f"topology={topology}")
    m, hw, w = specs_from_cfg(cfg)
    p = planned(searched, model=m, hardware=hw, workload=w)
    best = p.best
    assert best.fits and best.memory.total <= hw.memory_bytes * w.memory_fraction
    assert best.candidate.world_size == hw.world_size
    assert p.rejected > 0  # the budget really dropped layouts (e.g. pure dp for 175B)
    if model != "gpt_7b":
        assert best.candidate.pp > 1 and best.candidate.tp > 1  # deep, many devices → hybrid with pipeline
        assert "deep" in p.reason and "hybrid" in p.reason


def test_one_gbe_keeps_dp_off_the_inter_node_link(compose_cfg):
    cfg = compose_cfg("model=gpt_7b", "topology=cluster_1gbe", "planner.global_batch_size=128")
    m, hw, w = specs_from_cfg(cfg)
    p = plan(model=m, hardware=hw, workload=w)
    best = p.best.candidate
    assert not hw.crosses_nodes(span=best.dp, stride=best.stride("dp"))
    assert hw.crosses_nodes(span=best.pp, stride=best.stride("pp"))
    # the same model and batch on InfiniBand-class links may run dp across nodes
    fast = compose_cfg(
        "model=gpt_7b",
        "topology=cluster_1gbe",
        "planner.global_batch_size=128",
        "topology.inter_node_gbps=3200",
        "topology.devices_per_nic=1",
    )
    m2, hw2, w2 = specs_from_cfg(fast)
    assert (repr(m2), repr(w2)) == (repr(m), repr(w))  # only the links differ
    p2 = plan(model=m2, hardware=hw2, workload=w2)
    assert p2.best.step_time_s < p.best.step_time_s


def test_small_model_on_local_cpu_follows_the_seed(compose_cfg):
    cfg = compose_cfg("model=gpt_small", "topology=local_cpu", "topology.devices_per_node=2")
    m, hw, w = specs_from_cfg(cfg)
    p = plan(model=m, hardware=hw, workload=w, allowed=["single", "ddp"])
    assert p.reason.startswith("fits one device")
    assert {strategy_of(e.candidate) for e in p.ranked} == {"ddp"}  # world size 2: ddp is the only option here


def test_the_reason_names_what_its_numbers_are_and_the_header_counts_like_people(compose_cfg, capsys):
    """The reason's "fits one device" number is the whole model with 1-sample micro-batches (a layout the table
    need not list), said so; the chosen row's own memory follows it. gpt_small has 870,656 parameters."""
    from parallel.plan.cli import print_table
    from parallel.plan.search import one_device_need
    from parallel.plan.specs import GB

    cfg = compose_cfg("model=gpt_small", "topology=local_cpu")
    m, hw, w = specs_from_cfg(cfg)
    p = plan(model=m, hardware=hw, workload=w)
    need = one_device_need(model=m, hardware=hw, workload=w).memory.total / GB
    assert f"fits one device (the whole model with 1-sample micro-batches: {need:.3g} of " in p.reason
    assert f": {p.best.memory.total / GB:.3g} GB per rank, {p.best.step_time_s:.3g} s/step" in p.reason
    print_table(p, top=3, elapsed_s=0.1)
    out = capsys.readouterr().out
    assert out.startswith(f"gpt_small: {m.params / 1e3:.1f}K params,") and f"{m.params / 1e3:.1f}K" == "870.7K"
    assert f"reason: {p.reason[:40]}" in out


def test_plan_json_contract(capsys, remembering):
    assert main(["model=gpt_175b", "topology=cluster_1024xh100", "--json", "--top", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["params"] > 1.7e11 and out["model"]["flops_per_token"] > 6 * out["model"]["params"]
    assert out["topology"]["world_size"] == 1024
    cands = out["candidates"]
    assert len(cands) == 5 and [c["rank"] for c in cands] == [1, 2, 3, 4, 5]
    for c in cands:
        for key in (
            "dp",
            "tp",
            "pp",
            "micro_batches",
            "schedule",
            "step_time_s",
            "bubble_fraction",
            "comm_fraction",
            "fits",
        ):
            assert key in c
        assert set(c["memory_per_rank_bytes"]) >= {"params", "grads", "optimizer", "activations"}
        assert c["dp"] * c["tp"] * c["pp"] == 1024 and c["fits"]
    assert [c["step_time_s"] for c in cands] == sorted(c["step_time_s"] for c in cands)


def test_plan_cli_refuses_clearly(capsys, monkeypatch):
    """``python -m parallel.plan`` exits with ``main``'s code: 2 and the reason on stderr (the command as a process,
    torch-free: tests/integration/test_command_line_processes.py)."""
    plan_cli_composes_once(monkeypatch)
    assert main(["model=cnn_bn", "data=images"]) == 2
    assert "has no parameter/FLOP formulas" in capsys.readouterr().err
    assert main(["model=gpt_175b", "topology=gpu_node"]) == 2
    assert "no layout of model=gpt_175b fits" in capsys.readouterr().err


def test_planner_only_models_are_refused_by_validation(compose_cfg):
    with pytest.raises(ConfigError, match="model=gpt_175b is a description for the planner"):
        validate(compose_cfg("model=gpt_175b"))


def test_available_strategies_follow_the_checkout():
    found = available_strategies(CONF)
    assert {"single", "ddp"} <= set(found) and "auto" not in found
    assert found["ddp"] == "parallel.strategies.ddp.DDPStrategy"


def test_apply_candidate_rewrites_the_config(compose_cfg):
    cfg = compose_cfg("parallel=auto", "data.global_batch_size=16")
    apply_candidate(cfg, Candidate(dp=2, micro_batches=4), strategies=available_strategies(CONF))
    assert cfg.parallel.name == "ddp" and cfg.parallel._target_ == "parallel.strategies.ddp.DDPStrategy"
    assert cfg.dp.size == 2 and cfg.data.micro_batch_size == 2
    assert validate(cfg).layout.dp == 2


def run_warnings(cfg, layout) -> list[str]:
    """The planner's warnings for ``layout`` (``trainer/task.py`` ``checked`` logs them): on the typed run and request
    it makes once."""
    return layout_warnings(run_spec(cfg, layout), planner_request(cfg))


def test_run_warnings_name_the_pitfalls(compose_cfg):
    # uneven blocks on a 2-stage pipeline: the first stage does far more work
    cfg = compose_cfg("model=gpt_small", "model.layer_d_ff=[4096,4096,128,128]", "pp.micro_batches=2")
    layout = ParallelLayout(strategy="pp", pp=2, micro_batches=2, schedule="1f1b", nproc_per_node=2)
    warnings = run_warnings(cfg, layout)
    assert any("imbalanced" in w and "pp.split_points" in w for w in warnings), warnings
    # dp across two nodes joined by 1 Gbit/s Ethernet, with a model whose gradients are large
    cfg = compose_cfg(
        "model=gpt_small",
        "topology=multi_node",
        "topology.nproc_per_node=1",
        "model.d_model=1024",
        "model.d_ff=4096",
        "model.n_heads=8",
        "topology.inter_node_gbps=1.0",
        "data.global_batch_size=2",
    )
    layout = ParallelLayout(strategy="ddp", dp=2, nnodes=2, nproc_per_node=1)
    assert any("spans 2 nodes" in w and "topology.inter_node_gbps" in w for w in run_warnings(cfg, layout))
    # activations over the budget
    cfg = compose_cfg("model=gpt_small", "topology.device_memory_gb=0.001")
    layout = ParallelLayout(strategy="ddp", dp=2, nproc_per_node=2)
    assert any("exceeds the budget" in w for w in run_warnings(cfg, layout))
    # the default run is clean
    cfg = compose_cfg()
    assert run_warnings(cfg, validate(cfg).layout) == []


def test_plan_error_names_the_key(compose_cfg):
    cfg = compose_cfg("planner.precision=fp8")
    with pytest.raises(PlanError, match="planner.precision=fp8"):
        specs_from_cfg(cfg)


def test_plan_output_names_the_three_traps_with_their_numbers(compose_cfg):
    """1 GbE under data parallel, unbalanced stages, GPipe's activations growing with micro-batches: each is a
    pitfall line under the plan with the numbers that trigger it (the cost model's own terms)."""
    import io
    from dataclasses import replace

    from parallel.plan.cli import print_table
    from parallel.plan.cost_model import Candidate, estimate
    from parallel.plan.search import Plan, pitfalls

    def traps(cfg, c):
        model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
        est = estimate(c, model=model, hardware=hardware, workload=workload)
        return pitfalls(c, est, model=model, hardware=hardware, workload=workload), (model, hardware, workload, est)

    slow, _ = traps(
        compose_cfg("model=gpt_7b", "topology=cluster_1gbe"), Candidate(dp=16, micro_batches=64, zero_stage=3)
    )
    assert any("spans 2 nodes over" in w and "gradient all-reduce takes" in w for w in slow), slow
    uneven = compose_cfg("model=gpt_small", "model.n_layers=4", "model.layer_d_ff=[4096,64,64,64]")
    imbalanced, _ = traps(uneven, Candidate(pp=2, micro_batches=4, schedule="1f1b"))
    assert any("imbalanced by" in w and "predicted ms per micro-batch" in w for w in imbalanced), imbalanced
    gpipe = Candidate(pp=4, tp=2, micro_batches=64, schedule="gpipe")
    grows, (model, hardware, workload, est) = traps(compose_cfg("model=gpt_7b", "topology=gpu_node"), gpipe)
    line = next(w for w in grows if "keeps all 64 micro-batches' activations" in w)
    assert f"{est.memory.activations / 1e9:.3g} GB" in line and "1f1b holds at most 4" in line
    # and the plan prints them under its table (``plan`` fills ``Plan.pitfalls`` for its first choice)
    fake = Plan(
        model=model,
        hardware=hardware,
        workload=workload,
        ranked=(est,),
        rejected=0,
        closest_misses=(),
        reason="test",
        pitfalls=tuple(grows),
    )
    buf = io.StringIO()
    print_table(fake, top=1, elapsed_s=0.0, file=buf)
    assert "pitfall:" in buf.getvalue() and "keeps all 64 micro-batches" in buf.getvalue().replace("\n", " ")
    assert replace(gpipe, schedule="1f1b") != gpipe


@pytest.mark.parametrize(
    "count,text", [(870_656, "870.7K"), (1.236e9, "1.2B"), (124_439_808, "124.4M"), (175e9, "175B"), (999_950, "1M")]
)
def test_counts_read_as_people_write_them(count, text):
    from parallel.plan.specs import count_text

    assert count_text(count) == text
