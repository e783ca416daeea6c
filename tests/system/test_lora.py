"""LoRA in one process (models/lora.py, trainer/export.py): adapters start as a no-op beside frozen weights, are the
only trainable tensors, draw the same values whole or sliced, and a checkpoint with trained adapters exports as a
PEFT adapter folder that peft loads over the base model with meshtrain's logits, or merged into a whole model."""

from __future__ import annotations

import json

import pytest
import torch

from models.lora import LoRA, apply_lora, init_lora, is_adapter, merged_state
from tests.hf_helpers import hf_model, max_logit_difference, meshtrain_twin, save_folder
from trainer.checkpoint.files import MARKER

LORA = LoRA(rank=4, alpha=8.0, targets=("wq", "wv", "w2"))


def _twin():
    hf = hf_model("qwen3", num_key_value_heads=2, head_dim=32)
    module, model_cfg = meshtrain_twin("qwen3", hf)
    return hf, module, model_cfg


def test_adapters_start_as_a_no_op_and_are_the_only_trainable_tensors():
    _, module, _ = _twin()
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = module(tokens)
    adapted = apply_lora(module, LORA)
    assert len(adapted) == 3 * 2 and "layers.0.attention.wq" in adapted and "layers.1.feed_forward.w2" in adapted
    assert init_lora(module, seed=0) == 2 * len(adapted)
    with torch.no_grad():
        assert torch.equal(module(tokens), before)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in module.named_parameters() if is_adapter(n)} and len(trainable) == 12
    module(tokens).sum().backward()
    assert all((p.grad is not None) == p.requires_grad for p in module.parameters())
    # the same draw whatever else the module holds (a stage, a shard): by seed and name only
    a = module.layers["0"].attention.wq.lora_A.weight.clone()
    init_lora(module, seed=0)
    assert torch.equal(module.layers["0"].attention.wq.lora_A.weight, a)
    init_lora(module, seed=1)
    assert not torch.equal(module.layers["0"].attention.wq.lora_A.weight, a)


def test_unknown_targets_are_refused_with_the_layer_names():
    _, module, _ = _twin()
    with pytest.raises(ValueError, match=r"match no linear layer.*'w1', 'w2', 'w3', 'wk', 'wo', 'wq', 'wv'"):
        apply_lora(module, LoRA(rank=2, targets=("q_proj",)))


def _trained_run(tmp_path):
    """A checkpoint of the twin with trained-looking adapters (random A and B), as a LoRA run leaves it."""
    import torch.distributed.checkpoint as dcp

    hf, module, model_cfg = _twin()
    base = save_folder(hf, tmp_path / "base")
    apply_lora(module, LORA)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if is_adapter(name):
                p.normal_(0.0, 0.05)
    step = tmp_path / "run" / "checkpoints" / "step_0000001"
    dcp.save({"model": module.state_dict()}, checkpoint_id=str(step), no_dist=True)
    lora = {"rank": LORA.rank, "alpha": LORA.alpha, "dropout": 0.0, "targets": list(LORA.targets)}
    marker = {**model_cfg, "family": "qwen3", "name": "qwen3", "init_from": str(base), "lora": lora}
    (step / MARKER).write_text(json.dumps({"step": 1, "model": marker}))
    return hf, module.eval(), base


def test_a_peft_adapter_folder_loads_over_the_base_with_meshtrains_logits(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainer.export import main

    _, module, base = _trained_run(tmp_path)
    out = tmp_path / "adapter"
    assert main([str(tmp_path / "run"), "--hf", str(out)]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8.0
    assert "model.layers.0.self_attn.q_proj" in config["target_modules"] and len(config["target_modules"]) == 6
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out).eval()
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = module(tokens), peft(tokens).logits
        plain = AutoModelForCausalLM.from_pretrained(base).eval()(tokens).logits
    diff = max_logit_difference(ours, theirs)
    print(f"PEFT adapter over the base: max |logit difference| {diff:.2e} (adapters move logits by "
          f"{max_logit_difference(ours, plain):.2e})")  # fmt: skip
    assert diff <= 1e-5 < max_logit_difference(ours, plain)


def test_merge_folds_the_adapters_into_a_whole_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from trainer.export import main

    _, module, _ = _trained_run(tmp_path)
    out = tmp_path / "merged"
    assert main([str(tmp_path / "run"), "--hf", str(out), "--merge"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), merged(tokens).logits)
    print(f"merged export: max |logit difference| {diff:.2e}")
    assert diff <= 1e-5
    state = merged_state(module.state_dict(), LORA)
    assert not any(is_adapter(k) for k in state) and set(state) == {k for k in module.state_dict() if not is_adapter(k)}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("model.lora.rank=-1",), "model.lora.rank=-1: must be a whole number >= 0"),
        (("model.lora.rank=4", "model.lora.alpha=0"), "model.lora.alpha=0"),
        (("model.lora.rank=4", "model.lora.targets=[]"), "model.lora.targets=[]: name the linear layers"),
    ],
)
def test_lora_settings_are_checked_before_any_worker(compose_cfg, overrides, message):
    from trainer.checks.findings import ConfigError
    from trainer.validate import validate

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides), environ={})
    assert message in str(err.value)
