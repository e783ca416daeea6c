"""model.init: each tensor's standard deviation follows its family's rule (models/init.py), on a whole model, on a
meta-device build initialised after ``to_empty`` and on a pipeline stage holding later blocks only; ``normal`` keeps
N(0, 0.02); a rule that does not exist is refused by validation and by the constructor."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from models.gpt.model import GPT
from models.init import gpt2_residual_std, llama_depth_std, llama_output_std
from models.llama.model import Llama
from models.qwen3.model import Qwen3

D, LAYERS, VOCAB = 256, 4, 2048
TRUNC3 = math.sqrt(1 - 2 * 3 * math.exp(-4.5) / math.sqrt(2 * math.pi) / math.erf(3 / math.sqrt(2)))
"""The standard deviation of N(0, 1) truncated at +-3, as a fraction of 1 (0.9866)."""


def llama_rule(name: str, *, tied: bool = False) -> float | None:
    """The reference standard deviation of ``name`` (None: a norm, all ones)."""
    if "norm" in name:
        return None
    if name == "output.weight" or (tied and name == "tok_embeddings.weight"):
        return llama_output_std(D) * TRUNC3
    if name == "tok_embeddings.weight":
        return 1.0
    layer = int(name.split(".")[1])
    if name.endswith(("wo.weight", "w2.weight", "w3.weight")):
        return llama_depth_std(layer)
    return 0.02


@torch.no_grad()
def assert_follows(model: nn.Module, rule, rel: float = 0.04) -> None:
    seen = 0
    for name, p in model.named_parameters():
        expected = rule(name)
        if expected is None:
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        assert abs(float(p.mean())) < 3 * expected / math.sqrt(p.numel()) + 1e-7, name
        assert float(p.std()) == pytest.approx(expected, rel=rel), name
        seen += 1
    assert seen


def llama(**kw):
    base = dict(vocab_size=VOCAB, n_layers=LAYERS, d_model=D, n_heads=8, n_kv_heads=4, d_ff=512, max_seq_len=32)
    return Llama(**{**base, **kw})


def test_llama_reference_rule_per_tensor():
    torch.manual_seed(0)
    model = llama()
    assert_follows(model, llama_rule)
    out = model.output.weight
    assert float(out.abs().max()) <= 3 * llama_output_std(D) + 1e-6  # truncated at 3 standard deviations


def test_qwen3_tied_embedding_takes_the_output_rule():
    torch.manual_seed(0)
    model = Qwen3(
        vocab_size=VOCAB,
        n_layers=LAYERS,
        d_model=D,
        n_heads=8,
        n_kv_heads=4,
        head_dim=64,
        d_ff=512,
        tie_embeddings=True,
    )
    assert model.output.weight is model.tok_embeddings.weight
    assert_follows(model, lambda n: llama_rule(n, tied=True))


@torch.no_grad()
def test_gpt2_reference_scales_the_residual_projections():
    torch.manual_seed(0)
    model = GPT(vocab_size=VOCAB, n_layers=LAYERS, d_model=D, n_heads=8, max_seq_len=64, bias=True)

    def rule(name: str) -> float | None:
        if "norm" in name or name.endswith("bias"):
            return "skip"
        if name.endswith(("wo.weight", "w2.weight")):
            return gpt2_residual_std(LAYERS)
        return 0.02

    for name, p in model.named_parameters():
        expected = rule(name)
        if expected == "skip":
            assert torch.equal(p, torch.ones_like(p) if "norm" in name and "weight" in name else torch.zeros_like(p))
            continue
        assert float(p.std()) == pytest.approx(expected, rel=0.04), name


@pytest.mark.parametrize("family", ["llama", "gpt"])
@torch.no_grad()
def test_normal_rule_is_n_0_002(family):
    torch.manual_seed(0)
    if family == "llama":
        model = llama(init="normal")
    else:
        model = GPT(vocab_size=VOCAB, n_layers=LAYERS, d_model=D, n_heads=8, init="normal")
    for name, p in model.named_parameters():
        if "norm" not in name:
            assert float(p.std()) == pytest.approx(0.02, rel=0.04), name


def test_meta_build_and_a_later_pipeline_stage_follow_the_same_rule():
    with torch.device("meta"):
        model = llama()
    # a stage holding blocks 2 and 3 and the head, as parallel/pipeline/split.py leaves it
    del model.layers["0"], model.layers["1"]
    model.tok_embeddings = None
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    model.init_weights()
    assert sorted(model.layers) == ["2", "3"]
    assert_follows(model, llama_rule)
    torch.testing.assert_close(model.rope, model._rotary_table())


def test_an_unknown_rule_is_refused():
    from omegaconf import OmegaConf

    from models.gpt.spec import gpt_problems
    from models.llama.spec import llama_problems

    cfg = OmegaConf.create({"vocab_size": 256, "n_layers": 2, "d_model": 64, "n_heads": 4, "init": "xavier"})
    for problems in (gpt_problems(cfg), llama_problems(cfg)):
        assert any("model.init=xavier" in p and "reference, normal" in p for p in problems), problems
    with pytest.raises(ValueError, match="model.init=xavier"):
        llama(init="xavier")
