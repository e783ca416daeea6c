"""Tiny transformers models written locally (random weights, no download) and their meshtrain twins, for the
Hugging Face tests in tests/unit and tests/integration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: case -> (meshtrain family, transformers config keywords): every family and every option the adapters map
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_gqa": ("llama", {"num_key_value_heads": 2}),
    "llama_mha": ("llama", {"num_key_value_heads": 4}),
    "llama_tied": ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    "llama_rope_scaling": (
        "llama",
        {
            "num_key_value_heads": 2,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "qwen3_gqa": ("qwen3", {"num_key_value_heads": 2, "head_dim": 32}),
    "qwen3_tied_mha": ("qwen3", {"num_key_value_heads": 4, "head_dim": 8, "tie_word_embeddings": True}),
    "qwen3_moe": ("qwen3_moe", {"num_key_value_heads": 2, "head_dim": 32}),
    "qwen3_moe_dense_layer_top1": (
        "qwen3_moe",
        {"num_key_value_heads": 4, "head_dim": 16, "mlp_only_layers": [0], "num_experts_per_tok": 1},
    ),
    "qwen3_moe_unnormalised_step2": (
        "qwen3_moe",
        {"num_key_value_heads": 2, "head_dim": 16, "norm_topk_prob": False, "decoder_sparse_step": 2},
    ),
    "deepseek_v3": ("deepseek_v3", {}),
    "deepseek_v3_yarn_no_q_rank": (
        "deepseek_v3",
        {
            "q_lora_rank": None,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    ),
    "deepseek_v3_ungrouped_unnormalised": (
        "deepseek_v3",
        {"n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0, "n_shared_experts": 2},
    ),
    "gpt2": ("gpt", {}),
    "gpt_exact_gelu_untied": ("gpt", {"activation_function": "gelu", "tie_word_embeddings": False}),
}

VOCAB, WIDTH, LAYERS, HEADS, FFN, POSITIONS = 96, 64, 2, 4, 96, 64


def hf_config(family: str, **overrides: Any):
    """A tiny transformers config of ``family`` (rms_norm_eps 1e-5, as meshtrain's Llama defaults to)."""
    from transformers import DeepseekV3Config, GPT2Config, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    if family == "gpt":
        keys = {"n_positions": POSITIONS, "n_embd": WIDTH, "n_layer": LAYERS, "n_head": HEADS, "n_inner": FFN}
        return GPT2Config(**{"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0, **keys, **overrides})
    shared = {
        "vocab_size": VOCAB,
        "hidden_size": WIDTH,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "max_position_embeddings": POSITIONS,
        "rms_norm_eps": 1e-5,
    }
    if family == "deepseek_v3":  # MLA (q rank 48, kv rank 32, 16 + 8 rotary qk, 16 v); 8 experts in 4 groups
        mla = {"q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
        moe = {"n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        route = {"n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5}
        return DeepseekV3Config(**{**shared, "num_key_value_heads": HEADS, **mla, **moe, **route, **overrides})
    if family == "qwen3_moe":  # 8 experts of width 32, 2 per token (the cases change some)
        moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}
        return Qwen3MoeConfig(**{**shared, **moe, **overrides})
    return (LlamaConfig if family == "llama" else Qwen3Config)(**{**shared, **overrides})


def hf_model(family: str, *, seed: int = 0, **overrides: Any):
    """A random transformers model whose norm weights and biases are random too (at their defaults of 1 and 0 a
    wrongly mapped or unpermuted norm or bias would go unnoticed)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
        for name, b in model.named_buffers():  # DeepSeek-V3's routing bias: picks experts, so it must be read
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)
    return model


def save_folder(model, folder: Path, *, max_shard_size: str | None = None) -> Path:
    """``save_pretrained`` into ``folder`` (safetensors; shards and an index past ``max_shard_size``)."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return folder


def meshtrain_twin(family: str, hf, *, max_seq_len: int = 32):
    """(meshtrain module with ``hf``'s weights through the family's adapter, its model config)."""
    from hydra.utils import instantiate

    from models.registry import REGISTRY
    from models.spec import builder_kwargs

    spec = REGISTRY[family]
    adapter = spec.hf_adapter_obj()
    model_cfg = {"_target_": spec.builder, **adapter.model_config(hf.config.to_dict())}
    if family != "gpt":  # the GPT's position table is the checkpoint's; the rotary table is any length
        model_cfg["max_seq_len"] = max_seq_len
    module = instantiate(builder_kwargs(model_cfg)).eval()
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    module.load_state_dict(adapter.from_hf(checkpoint_tensors(hf), model_cfg, shapes))
    return module, model_cfg


def checkpoint_tensors(hf) -> dict:
    """``hf``'s tensors as its checkpoint holds them: transformers 5 fuses a Qwen3-MoE layer's experts in memory
    (``experts.gate_up_proj``) and writes them per expert, as DeepSeek-V3's, so those families' are read back from ``save_pretrained``."""
    if hf.config.model_type not in ("qwen3_moe", "deepseek_v3"):
        return hf.state_dict()
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        out = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            out.update(load_file(file))
    return out


def max_logit_difference(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def run_lm_eval(folder: Path, tasks: Path):
    """lm-evaluation-harness's command on a model folder with nothing else about the model (``--model hf
    --model_args pretrained=FOLDER``): a local three-row multiple-choice task written into ``tasks`` (json data files,
    ``--include_path``; no download). Returns the finished process (its stdout printed)."""
    import json
    import os
    import subprocess
    import sys

    tasks.mkdir(parents=True, exist_ok=True)
    rows = [
        {"question": "1 + 1 =", "choices": [" 2", " 3"], "answer": 0},
        {"question": "def f(): return", "choices": [" None", " )("], "answer": 0},
        {"question": "import", "choices": [" os", " ]]"], "answer": 0},
    ]
    (tasks / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "tiny_mc.yaml").write_text(
        "task: meshtrain_tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tasks / 'rows.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n"
    )
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={folder}"]
    command += ["--tasks", "meshtrain_tiny_mc", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "1"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    print(done.stdout[-2000:])
    return done


#: tiny configs of architectures no native family reads, run by the Hugging Face backend (models/hf_transformers):
#: model_type -> transformers config keywords over ``ARCH_BASE`` (sliding windows shorter than data.seq_len=32, so
#: the sliding layers' masks differ from the full ones)
ARCH_BASE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 8},
    "gemma3_text": {
        "head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    },
    "phi3": {},
    "olmo2": {},
    "granite": {"embedding_multiplier": 2.0, "logits_scaling": 4.0, "residual_multiplier": 0.5},
    "smollm3": {},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 32,
        "rope_scaling": None,
    },
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "sliding_window": 8},
}


def save_architecture(model_type: str, folder: Path, *, seed: int = 0, **changes: Any) -> Path:
    """A random tiny ``model_type`` written by transformers (``save_pretrained``, nothing downloaded), its norm
    weights and biases random too (at 1 and 0 a misplaced one would go unnoticed); ``changes`` over its config
    keywords (``sliding_window=None``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**ARCH_BASE, **ARCHITECTURES[model_type], **changes})
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if p.mean() > 0.5 else 0.0, 0.2)
            elif name.endswith("bias") or name.endswith("sinks"):
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder


def add_mtp_layers(folder: Path, out: Path, *, depth: int = 1, seed: int = 0) -> Path:
    """A copy of a transformers-saved DeepseekV3 ``folder`` at ``out`` with ``depth`` MTP layers (meshtrain's
    initialisation from ``seed``) in the published layout vLLM reads (``model.layers.{num_hidden_layers + k - 1}``,
    ``num_nextn_predict_layers``): transformers saves none."""
    import json
    import shutil

    import torch
    from hydra.utils import instantiate
    from safetensors.torch import load_file, save_file

    from models.deepseek_v3.hf_adapter import ADAPTER
    from models.spec import builder_kwargs

    shutil.copytree(folder, out)
    hf = json.loads((out / "config.json").read_text())
    hf["num_nextn_predict_layers"] = depth
    (out / "config.json").write_text(json.dumps(hf, indent=2))
    model_cfg = {"_target_": "models.deepseek_v3.model.DeepseekV3", **ADAPTER.model_config(hf), "mtp_depth": depth}
    torch.manual_seed(seed)
    module = instantiate(builder_kwargs({**model_cfg, "max_seq_len": 32}))
    tensors = load_file(out / "model.safetensors")
    main = int(hf["num_hidden_layers"])
    for key, value in ADAPTER.to_hf(module.state_dict(), model_cfg).items():
        if key.startswith("model.layers.") and int(key.split(".")[2]) >= main:
            copy = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
            tail = key.split(".", 3)[3]
            tensors[key] = tensors[copy[tail]].clone() if tail in copy else value.contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
