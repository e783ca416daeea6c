"""The planner counts frozen weights as frozen: with ``model.lora.rank > 0`` gradients, optimizer states, the
data-parallel reduction and the optimizer's time come from the adapters alone, counted against the
``requires_grad`` parameters of the model the trainer builds (on the meta device, with ``apply_lora``)."""

from __future__ import annotations

import pytest

from models.lora import LoRA, LoRALinear
from models.registry import typed_model
from parallel.plan.cli import plain, specs_from_cfg
from parallel.plan.cost_model import Candidate, estimate
from parallel.plan.dry_run import build_meta_model

CASES = [
    ("model=llama_debug", "[wq,wv,w2]"),
    ("model=gpt_small", "[wq,wk,wv,wo,w1,w2]"),
    ("model=qwen3_debug", "['layers.0.attention.*',w3]"),
]


def _built_trainable(cfg) -> tuple[int, int]:
    """(trainable, all) parameters of the built model with its adapters (``requires_grad``): built on the meta
    device by its family's builder, adapters added by the trainer's ``apply_lora``."""
    typed = typed_model(plain(cfg.model))
    model = build_meta_model(typed)
    assert (LoRA.of(typed) is not None) == any(isinstance(m, LoRALinear) for m in model.modules())
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


@pytest.mark.parametrize(("model", "targets"), CASES)
def test_lora_grads_and_optimizer_states_are_the_adapters_bytes(compose_cfg, model, targets):
    cfg = compose_cfg(model, "model.lora.rank=4", f"model.lora.targets={targets}", "parallel=single")
    shape, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    trainable, total = _built_trainable(cfg)
    assert 0 < trainable < total / 10
    assert shape.trainable_params == trainable
    w, g, k = workload.bytes_per_param
    one = estimate(Candidate(dp=1), model=shape, hardware=hardware, workload=workload)
    assert one.memory.grads == trainable * g and one.memory.optimizer == trainable * k
    assert one.memory.params == pytest.approx(total * w)  # the frozen weights are still held in full
    # pipeline ranks split the adapters; ZeRO-1 shards their optimizer states over dp
    pp = estimate(Candidate(pp=2, micro_batches=2, schedule="1f1b"), model=shape, hardware=hardware, workload=workload)
    assert sum(m.grads for m in pp.rank_memory) == trainable * g
    zero1 = estimate(Candidate(dp=2, zero_stage=1), model=shape, hardware=hardware, workload=workload)
    assert zero1.memory.optimizer == trainable * k / 2 and zero1.memory.grads == trainable * g


def test_lora_shrinks_the_dp_reduction_and_the_optimizer_time(compose_cfg):
    base = compose_cfg("model=llama_debug", "parallel=single")
    lora = compose_cfg("model=llama_debug", "model.lora.rank=4", "parallel=single")
    out = {}
    for name, cfg in (("base", base), ("lora", lora)):
        shape, hardware, workload = specs_from_cfg(cfg, calibrate=False)
        out[name] = estimate(Candidate(dp=2), model=shape, hardware=hardware, workload=workload)
    trainable, total = _built_trainable(lora)
    ratio = trainable / (total - trainable)  # the base model has no adapters
    assert out["lora"].optimizer_s == pytest.approx(out["base"].optimizer_s * ratio)
    assert 0 < out["lora"].dp_comm_s < out["base"].dp_comm_s
    assert out["lora"].memory.params == out["base"].memory.params + trainable * workload.bytes_per_param[0]


def test_without_lora_every_parameter_trains(compose_cfg):
    cfg = compose_cfg("model=llama_debug", "parallel=single")
    shape, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    trainable, total = _built_trainable(cfg)
    assert shape.lora_rank == 0 and shape.trainable_params == shape.params == trainable == total
    w, g, k = workload.bytes_per_param
    one = estimate(Candidate(dp=1), model=shape, hardware=hardware, workload=workload)
    assert (one.memory.params, one.memory.grads, one.memory.optimizer) == (total * w, total * g, total * k)
