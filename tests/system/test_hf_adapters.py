"""Each family's Hugging Face adapter against transformers itself: tiny random models written in this process
(no download), mapped into meshtrain's modules, give transformers' logits to 1e-5 (fp32) for every family and
option (GQA, MHA, tied, Llama 3.1 rope scaling, Qwen3's q/k norms and own head width, GPT-2's biases, tanh GELU,
fused and transposed projections; DeepSeek-V3's MLA with and without the query rank, YaRN, grouped sigmoid routing
with its bias, shared experts); the mapping round-trips bit for bit; every published config maps to a
transformers model of the published size; what a family cannot represent is refused by name."""

from __future__ import annotations

import pytest
import torch

from models.hf_adapter import HFConfigError, Source
from models.registry import REGISTRY, model_shape
from tests.hf_helpers import CASES, checkpoint_tensors, hf_config, hf_model, max_logit_difference, meshtrain_twin

TOKENS = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(0))


def logits(module, tokens=TOKENS):
    with torch.no_grad():
        out = module(tokens)
    return getattr(out, "logits", out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_meshtrain_gives_transformers_logits(case):
    family, options = CASES[case]
    hf = hf_model(family, **options)
    module, _ = meshtrain_twin(family, hf)
    diff = max_logit_difference(logits(module), logits(hf))
    print(f"{case}: max |logit difference| {diff:.2e}")
    assert diff <= 1e-5, f"{case}: meshtrain's logits differ from transformers' by {diff:.2e}"


@pytest.mark.parametrize("case", ["llama_gqa", "qwen3_gqa"])
def test_without_the_rotary_permutation_the_logits_are_wrong(case, monkeypatch):
    """The permutation is what makes the parity hold: mapped by name alone, q and k rotate the wrong channels (at
    these tiny random weights attention is nearly uniform, so "wrong" is still over 100x the parity tolerance)."""
    family, options = CASES[case]
    hf = hf_model(family, **options)
    monkeypatch.setattr(type(REGISTRY[family].hf_adapter_obj()), "rotary", {})
    module, _ = meshtrain_twin(family, hf)
    assert max_logit_difference(logits(module), logits(hf)) > 1e-3


def test_rope_scaling_is_exercised():
    """The tiny case's context (32) passes its original length (16): without the scaling the logits differ."""
    family, options = CASES["llama_rope_scaling"]
    scaled, _ = meshtrain_twin(family, hf_model(family, **options))
    plain_options = {k: v for k, v in options.items() if k != "rope_scaling"}
    plain, _ = meshtrain_twin(family, hf_model(family, **plain_options))
    assert max_logit_difference(logits(scaled), logits(plain)) > 1e-3


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_dict_round_trips_bit_for_bit(case):
    family, options = CASES[case]
    hf = hf_model(family, **options)
    module, model_cfg = meshtrain_twin(family, hf)
    adapter = REGISTRY[family].hf_adapter_obj()
    back = adapter.to_hf(module.state_dict(), model_cfg)
    want = {k: v for k, v in checkpoint_tensors(hf).items() if not adapter.ignored(k, model_cfg)}
    assert sorted(back) == sorted(want)
    for key, value in want.items():
        assert torch.equal(back[key], value), key


def test_sliced_reads_equal_the_whole_tensors_slices():
    """What a rank reads (``Source.take`` on rows and columns of a shard) is that shard of the whole tensor, for a
    permuted, a fused-and-transposed and a plain source."""
    full = torch.arange(12 * 8 * 3, dtype=torch.float32).reshape(24, 12)

    def read(key, index):
        return full[index]

    sources = [Source("w", heads=3), Source("w", transpose=True, part=1, parts=2), Source("w")]
    shapes = [(24, 12), (12, 12), (24, 12)]
    for src, shape in zip(sources, shapes):
        whole = src.take(read, (slice(0, shape[0]), slice(0, shape[1])), shape)
        for rows, cols in [(slice(0, 5), slice(0, 12)), (slice(7, 19), slice(3, 9)), (slice(11, 12), slice(11, 12))]:
            assert torch.equal(src.take(read, (rows, cols), shape), whole[rows, cols]), (src, rows, cols)


@pytest.mark.parametrize(
    "name",
    [
        "llama_debug",
        "llama3_2_1b",
        "llama3_1_8b",
        "qwen3_debug",
        "qwen3_0_6b",
        "qwen3_8b",
        "qwen3_moe_debug",
        "qwen3_30b_a3b",
        "deepseek_v3_debug",
        "deepseek_v3_671b",
        "gpt2",
        "gpt_small",
    ],
)
def test_configs_map_to_transformers_models_of_the_same_size(compose_cfg, name):
    """config.json from each config builds (on the meta device) a transformers model with exactly meshtrain's
    parameter count (GPT-2's layout always has biases: gpt_small's are written as zeros; deepseek_v3_671b's MTP
    module, which transformers does not build, left out), and reads back to the same model keys."""
    from dataclasses import replace

    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoModelForCausalLM

    model_cfg = OmegaConf.to_container(compose_cfg(f"model={name}").model, resolve=True)
    adapter = REGISTRY[model_cfg["family"]].hf_adapter_obj()
    hf = adapter.hf_config(model_cfg)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf))
    shape = model_shape(OmegaConf.create(model_cfg))
    shape = replace(shape, bias=True) if model_cfg["family"] == "gpt" else shape
    mtp = sum(shape.layer_params(i) for i in shape.mtp_layers)
    assert sum(p.numel() for p in built.parameters()) == shape.params - mtp
    again = adapter.model_config(hf)
    assert again == adapter.model_config(adapter.hf_config({**model_cfg, **again}))


def test_published_llama31_config_reads_as_llama3_1_8b(compose_cfg):
    """A config.json in the older form (top-level rope_theta, rope_scaling), as Meta published it."""
    from omegaconf import OmegaConf

    published = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
    }
    mine = OmegaConf.to_container(compose_cfg("model=llama3_1_8b").model, resolve=True)
    adapter = REGISTRY["llama"].hf_adapter_obj()
    got = adapter.model_config(published)
    assert got == {k: mine[k] for k in got}
    assert adapter.hf_config(mine, base=published)["max_position_embeddings"] == 131072


def test_gpt_small_exports_as_a_gpt2_config_with_zero_biases(compose_cfg):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from models.spec import builder_kwargs

    model_cfg = OmegaConf.to_container(compose_cfg("model=gpt_small", "data.seq_len=16").model, resolve=True)
    adapter = REGISTRY["gpt"].hf_adapter_obj()
    hf = adapter.hf_config(model_cfg)
    assert (hf["activation_function"], hf["tie_word_embeddings"], hf["n_positions"]) == ("gelu", False, 16)
    tensors = adapter.to_hf(instantiate(builder_kwargs(model_cfg)).state_dict(), model_cfg)
    biases = [k for k in tensors if k.endswith(("c_attn.bias", "c_proj.bias", "c_fc.bias"))]
    assert len(biases) == 4 * model_cfg["n_layers"] and all(not tensors[k].any() for k in biases)
    assert tensors["transformer.h.0.attn.c_attn.bias"].shape == (3 * model_cfg["d_model"],)


@pytest.mark.parametrize(
    "family, change, words",
    [
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ("llama", {"head_dim": 32}, "head_dim=32"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("llama", {"attention_bias": True}, "attention_bias"),
        ("qwen3", {"use_sliding_window": True}, "use_sliding_window"),
        ("gpt", {"activation_function": "relu"}, "activation_function='relu'"),
        ("llama", {"model_type": "mistral"}, "model_type='mistral'"),
        ("deepseek_v3", {"rope_interleave": False}, "rope_interleave=false"),
        ("deepseek_v3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_type='linear'"),
    ],
)
def test_what_a_family_cannot_represent_is_refused_by_name(family, change, words):
    hf = {**hf_config(family).to_dict(), **change}
    with pytest.raises(HFConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
        REGISTRY[family].hf_adapter_obj().model_config(hf)


def test_a_family_without_an_adapter_says_so():
    with pytest.raises(ValueError, match="model family 'cnn' has no Hugging Face adapter"):
        REGISTRY["cnn"].hf_adapter_obj()
