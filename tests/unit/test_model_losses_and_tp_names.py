"""What a model family declares instead of what the strategies assume: its loss (``ModelSpec.loss``) and the module
names its tensor-parallel plan shards (``ModelSpec.tp_plan``), checked against built tiny models. In-process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.registry import REGISTRY
from models.spec import builder_kwargs

#: a small config of every built-in family with a tensor-parallel plan (a new family adds its own here)
TINY = {
    "gpt": "gpt_small",
    "llama": "llama_debug",
    "qwen3": "qwen3_debug",
    "qwen3_moe": "qwen3_moe_debug",
    "deepseek_v3": "deepseek_v3_debug",
}


def build_tiny(compose_cfg, family: str) -> torch.nn.Module:
    from hydra.utils import instantiate

    from models.registry import spec_for

    cfg = compose_cfg(f"model={TINY[family]}")
    assert spec_for(cfg.model) is REGISTRY[family]
    with torch.device("meta"):
        return instantiate(builder_kwargs(cfg.model))


def test_every_family_with_a_tp_plan_function_declares_its_module_names():
    # the Hugging Face backend's plan is each architecture's own (transformers' base_model_tp_plan), read from its
    # config.json: tests/system/test_hf_backend.py
    with_plan = {name for name, spec in REGISTRY.items() if spec.parallelize is not None and name != "hf"}
    assert with_plan == {name for name, spec in REGISTRY.items() if spec.tp_plan is not None}
    assert with_plan == set(TINY), "add a small config of the new family to TINY"


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_name_a_family_declares_exists_in_its_built_model(compose_cfg, family):
    from models.tensor_parallel import missing_modules

    model = build_tiny(compose_cfg, family)
    plan = REGISTRY[family].tp_plan
    present = dict(model.named_modules())
    names = plan.module_names(list(model.layers.keys()), present=present)
    absent = [n for n in names if n not in present]
    assert not absent, f"{family}'s ModelSpec.tp_plan names modules its model lacks: {absent}"
    assert missing_modules(model, plan) == []
    # the plan reads every projection of a block: q/k/v in, out; the feed-forward's inputs and output (a
    # mixture of experts' feed-forward runs whole: its router is read, its experts are not linear layers)
    for key in model.layers.keys():
        block = plan.block_modules(f"layers.{key}", present=present)
        inside = f"layers.{key}."
        whole = [f"{inside}{sub.module}." for sub in plan.sub_blocks if sub.is_whole(f"layers.{key}", present)]
        linears = {
            n
            for n, m in model.named_modules()
            if n.startswith(inside) and isinstance(m, torch.nn.Linear) and not n.startswith(tuple(whole))
        }  # a whole sub-block's linear layers (DeepSeek-V3's shared experts) run unsplit on every rank
        assert linears <= set(block), f"{family}: projections the plan leaves whole: {sorted(linears - set(block))}"


def test_a_mixture_of_experts_block_runs_whole_on_every_tp_rank(compose_cfg):
    """qwen3_moe_debug: layers 0-2 sparse (their feed-forward is not split; with sequence parallel its input is
    gathered and its output cut back to the shard), layer 3 dense (split as Qwen3's)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInputOutput

    from models.tensor_parallel import block_plan

    model = build_tiny(compose_cfg, "qwen3_moe")
    plan = REGISTRY["qwen3_moe"].tp_plan
    sparse = block_plan(plan, "layers.0", sequence_parallel=False, model=model)
    assert not [k for k in sparse if ".feed_forward" in k] and isinstance(
        sparse["layers.0.attention.wq"], ColwiseParallel
    )
    with_sp = block_plan(plan, "layers.0", sequence_parallel=True, model=model)
    assert isinstance(with_sp["layers.0.feed_forward"], PrepareModuleInputOutput)
    assert not [k for k in with_sp if k.startswith("layers.0.feed_forward.")]
    dense = block_plan(plan, "layers.3", sequence_parallel=False, model=model)
    assert {k for k in dense if ".feed_forward" in k} == {f"layers.3.feed_forward.{w}" for w in ("w1", "w2", "w3")}


def test_a_renamed_module_is_named_in_the_refusal(compose_cfg):
    from models.tensor_parallel import missing_modules

    model = build_tiny(compose_cfg, "llama")
    attention = model.layers["1"].attention
    attention.query = attention.wq
    del attention.wq
    assert missing_modules(model, REGISTRY["llama"].tp_plan) == ["layers.1.attention.wq"]


def test_a_pipeline_stage_needs_no_final_norm_or_head(compose_cfg):
    from models.tensor_parallel import missing_modules

    model = build_tiny(compose_cfg, "gpt")
    model.norm = model.output = None  # an early stage
    assert missing_modules(model, REGISTRY["gpt"].tp_plan) == []


def test_each_family_loss_is_its_own():
    for name, spec in REGISTRY.items():
        assert callable(spec.loss_fn()), name
    assert REGISTRY["cnn"].loss == "models.losses:class_cross_entropy"
    # DeepSeek-V3's adds its multi-token prediction modules' losses (models/mtp.py) to the same token loss
    assert {REGISTRY[f].loss for f in TINY if f != "deepseek_v3"} == {"models.losses:token_cross_entropy"}
    assert REGISTRY["deepseek_v3"].loss == "models.mtp:mtp_token_cross_entropy"


def test_token_cross_entropy_is_float32_over_every_position():
    from models.losses import token_cross_entropy

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11).bfloat16()
    targets = torch.randint(0, 11, (2, 5))
    loss = token_cross_entropy(logits, targets)
    assert loss.dtype == torch.float32
    want = F.cross_entropy(logits.float().reshape(10, 11), targets.reshape(10))
    assert torch.equal(loss, want)


def test_class_cross_entropy_takes_one_label_per_sample():
    from models.losses import class_cross_entropy

    logits, labels = torch.randn(4, 3), torch.tensor([0, 2, 1, 2])
    assert torch.equal(class_cross_entropy(logits, labels), F.cross_entropy(logits, labels))
    with pytest.raises(ValueError, match=r"\(batch, classes\) logits.*token_cross_entropy"):
        class_cross_entropy(torch.randn(2, 5, 3), torch.randint(0, 3, (2, 5)))
