"""The planner's calibration and dry run build the configured model family (``ModelSpec.builder`` with the kwargs of
``ModelSpec.resized``), not a GPT standing in for it; a family without ``resized`` (the CNN) is refused by name."""

from __future__ import annotations

import functools

import pytest

from models.registry import REGISTRY, typed_model
from parallel.plan import calibrate
from parallel.plan.calibrate import build_family, family_kwargs, measure_compute
from parallel.plan.cli import plain
from parallel.plan.dry_run import build_meta_model
from parallel.plan.specs import PlanError
from tests.planning import plan_cfg

CLASSES = {"gpt_small": "GPT", "llama_debug": "Llama", "qwen3_debug": "Qwen3"}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_resized_builds_the_family_at_the_given_sizes(name):
    cfg = plan_cfg(f"model={name}", "data.seq_len=64")
    family, kwargs = family_kwargs(typed_model(plain(cfg.model)), {"n_layers": 2, "vocab_size": 64})
    assert family is REGISTRY[cfg.model.family]
    model = build_family(family, kwargs)
    assert type(model).__name__ == CLASSES[name] and type(model).__module__ == family.builder.rpartition(".")[0]
    assert len(model.layers) == 2 and model.tok_embeddings.num_embeddings == 64
    assert kwargs["d_model"] == cfg.model.d_model and kwargs["max_seq_len"] == 64  # the rest as configured


def test_per_block_widths_are_cut_to_the_blocks_kept():
    cfg = plan_cfg("model=gpt_small", "model.layer_d_ff=[512,256,128,64]")
    _, kwargs = family_kwargs(typed_model(plain(cfg.model)), {"n_layers": 2})
    assert kwargs["layer_d_ff"] == [512, 256]


def test_a_planner_only_description_dry_runs_as_its_family():
    cfg = plan_cfg("model=llama3_8b")
    model = build_meta_model(typed_model(plain(cfg.model)))
    assert type(model).__name__ == "Llama" and len(model.layers) == cfg.model.n_layers
    assert next(model.parameters()).is_meta


def test_a_family_without_resized_is_refused_by_name_when_resized():
    cfg = plan_cfg("model=cnn_bn", "data=images")
    with pytest.raises(PlanError, match=r"model.family=cnn: .*max_seq_len=64.*no `resized`.*topology.calibrate=true"):
        family_kwargs(typed_model(plain(cfg.model)), {"max_seq_len": 64})
    family, kwargs = family_kwargs(
        typed_model(plain(cfg.model)), {}
    )  # at its own sizes: the config is the builder's kwargs
    assert type(build_family(family, kwargs)).__name__ == "ConvNet"


def test_calibrating_a_llama_config_times_a_llama(monkeypatch):
    cfg = plan_cfg("model=llama_debug", "data.seq_len=32")
    built = []

    def spy(family, kwargs):
        built.append(model := build_family(family, kwargs))
        return model

    monkeypatch.setattr(calibrate, "build_family", spy)
    # what is built and returned, not how well it is timed: one round of one timed step each (a whole calibration's
    # rounds: tests/integration/test_planner_vs_measured_steps.py)
    monkeypatch.setattr(
        calibrate, "_median_of_rounds", functools.partial(calibrate._median_of_rounds, rounds=1, reps=1)
    )
    monkeypatch.setattr(calibrate, "_timed", functools.partial(calibrate._timed, min_time=0.0, min_reps=1, warmup=1))
    c = measure_compute(typed_model(plain(cfg.model)), seq_len=32, threads=1)
    assert [type(m).__name__ for m in built] == ["Llama"]
    assert c["shape"].gated_mlp and c["shape"].n_kv_heads == 2  # Llama's formulas, not the GPT's
    assert c["flops"] > 0 and c["memory_bytes_per_s"] > 0
    assert c["fixed_costs"] == ["ddp_bucket_s", "pipeline_action_s", "tp_collective_s", "fsdp_collective_s"]
    assert c["model_values"]["family"] == "llama"  # what the two calibration processes rebuild the family from


def test_a_ddp_bucket_is_charged_to_ddp_only_and_solved_back_from_a_whole_step():
    from dataclasses import replace

    from parallel.plan.calibrate import FIXED_COST_LAYOUTS, solve_fixed_costs
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.cost_model import Candidate, ddp_buckets, estimate
    from parallel.plan.specs import Workload

    cfg = plan_cfg("model=gpt_small", "data.seq_len=64", "data.global_batch_size=16")
    shape, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    hardware = replace(hardware, devices_per_node=2, ddp_bucket_s=0.0)
    with_cost = replace(hardware, ddp_bucket_s=0.009)
    # gpt_small's 3.6 MB of gradients: torch's default buckets, a first of 1 MiB and one of 25 MiB
    assert ddp_buckets(shape.params * 4) == 2 and ddp_buckets(2**20) == 1 and ddp_buckets(2**20 + 25 * 2**20 + 1) == 3
    for c, charged in ((Candidate(dp=2), 2 * 0.009), (Candidate(dp=2, zero_stage=3), 0.0), (Candidate(), 0.0)):
        t0 = estimate(c, model=shape, hardware=hardware, workload=workload).step_time_s
        t1 = estimate(c, model=shape, hardware=with_cost, workload=workload).step_time_s
        assert t1 - t0 == pytest.approx(charged), c
    # a measured DDP step 9 ms above the model's step without the cost solves back to 9 ms per bucket
    candidate, batches = FIXED_COST_LAYOUTS["ddp_bucket_s"]
    compute = {"shape": shape, "proxy_overhead_s": hardware.microbatch_overhead_s, "seq_len": 64}
    w = Workload(global_batch_size=batches * 8, seq_len=64)
    measured = estimate(candidate, model=shape, hardware=with_cost, workload=w).step_time_s
    solved = solve_fixed_costs(hardware, compute=compute, steps={"ddp_bucket_s": measured})
    assert solved == {"ddp_bucket_s": pytest.approx(0.009)}
