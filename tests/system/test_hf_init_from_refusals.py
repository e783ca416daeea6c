"""``model.init_from`` is refused before any worker starts, with the fix, when the folder is not a Hugging Face
model folder, its config.json describes another model (each key with both values; a ``model=`` that matches), it
is another family's checkpoint, or its tensors are missing, unexpected or mis-shaped (by name). In-process."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.hf_helpers import hf_model, save_folder
from trainer.validate import ConfigError, validate

#: llama_debug's sizes: a folder written with them matches model=llama_debug as it is
LLAMA_DEBUG = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_folder(hf_model("llama", vocab_size=256, **LLAMA_DEBUG), tmp_path_factory.mktemp("hf") / "llama")


def refusal(compose_cfg, *overrides: str) -> str:
    with pytest.raises(ConfigError) as exc:
        validate(compose_cfg("parallel=single", *overrides))
    return str(exc.value)


def test_a_matching_folder_is_accepted(compose_cfg, folder):
    validate(compose_cfg("parallel=single", "model=llama_debug", f"model.init_from={folder}"))


def test_config_mismatch_names_each_key_both_values_and_the_fix(compose_cfg, folder):
    msg = refusal(compose_cfg, "model=llama3_2_1b", f"model.init_from={folder}")
    assert "model.n_layers: this run 16, config.json 4" in msg
    assert "model.d_model: this run 2048, config.json 128" in msg
    assert (
        "use model=llama_debug" in msg
        and "model.rope_scaling.factor=0.0" in msg
        and "model.tie_embeddings=false" in msg
    )
    msg = refusal(compose_cfg, "model=llama_debug", "model.n_kv_heads=4", f"model.init_from={folder}")
    assert "model.n_kv_heads: this run 4, config.json 2" in msg and "override: model.n_kv_heads=2" in msg


def test_another_family_is_refused(compose_cfg, folder):
    msg = refusal(compose_cfg, "model=qwen3_debug", f"model.init_from={folder}")
    assert "model_type='llama', not 'qwen3'" in msg
    msg = refusal(compose_cfg, "model=cnn_bn", "data=images", f"model.init_from={folder}")
    assert "model family 'cnn' has no Hugging Face adapter" in msg


@pytest.mark.parametrize(
    "damage, words",
    [
        ("no folder", "no such folder"),
        ("no config", "no config.json in it"),
        ("bin weights", "re-save it with save_pretrained(safe_serialization=True)"),
    ],
)
def test_not_a_model_folder(compose_cfg, folder, tmp_path, damage, words):
    bad = tmp_path / "bad"
    if damage != "no folder":
        shutil.copytree(folder, bad)
        (bad / "model.safetensors").unlink()
        if damage == "no config":
            (bad / "config.json").unlink()
        else:
            (bad / "pytorch_model.bin").write_bytes(b"")
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={bad}")
    assert words in msg and "model.init_from=" in msg


def test_missing_unexpected_and_misshaped_tensors_are_named(compose_cfg, folder, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.3.mlp.up_proj.weight"]
    tensors["model.layers.4.mlp.up_proj.weight"] = torch.zeros(384, 128)
    tensors["model.norm.weight"] = torch.ones(64)
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copyfile(folder / "config.json", bad / "config.json")
    save_file(tensors, str(bad / "model.safetensors"))
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={bad}")
    assert "1 tensor(s) this model reads are not in its safetensors: model.layers.3.mlp.up_proj.weight" in msg
    assert "no place for: model.layers.4.mlp.up_proj.weight" in msg
    assert "model.norm.weight (64,) (this model: (128,))" in msg


def test_an_unsupported_config_is_refused_by_key(compose_cfg, folder, tmp_path):
    bad = shutil.copytree(folder, tmp_path / "bad")
    config = json.loads((bad / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (bad / "config.json").write_text(json.dumps(config))
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={bad}")
    assert "rope_type='yarn'" in msg


def test_a_truncated_safetensors_file_is_refused_by_name(compose_cfg, folder, tmp_path):
    """A file cut short keeps a readable header: the check compares the header's extent with the file's size."""
    bad = shutil.copytree(folder, tmp_path / "bad")
    weights = bad / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 1000)
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={bad}")
    assert f"{weights}: truncated" in msg and f"but the file has {size - 1000}" in msg


def test_a_shard_missing_from_the_index_and_a_stale_index_are_refused_by_name(compose_cfg, tmp_path):
    sharded = save_folder(
        hf_model("llama", vocab_size=256, **LLAMA_DEBUG), tmp_path / "sharded", max_shard_size="300KB"
    )
    index_path = sharded / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    validate(compose_cfg("parallel=single", "model=llama_debug", f"model.init_from={sharded}"))
    # the index lists every shard but the last: that shard's tensors are mapped elsewhere or not at all
    stale = {**index, "weight_map": {k: v for k, v in index["weight_map"].items() if v != shards[-1]}}
    index_path.write_text(json.dumps(stale))
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={sharded}")
    assert f"{shards[-1]} is not in model.safetensors.index.json" in msg
    # the index maps a tensor to a shard that does not hold it
    key = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index_path.write_text(json.dumps({**index, "weight_map": {**index["weight_map"], key: shards[1]}}))
    msg = refusal(compose_cfg, "model=llama_debug", f"model.init_from={sharded}")
    assert f"maps {key} to shards that do not hold them" in msg


def test_a_gpt2_folder_under_a_bias_free_model_names_model_bias_true(compose_cfg, tmp_path):
    """The default job's export (gpt_small, written as GPT-2 with zero biases) under model=gpt_small: the hint
    names the override that works, not the model= it already is."""
    sizes = {"n_embd": 128, "n_layer": 4, "n_head": 4, "n_inner": 512, "n_positions": 128, "vocab_size": 256}
    sizes |= {"activation_function": "gelu", "tie_word_embeddings": False}  # as trainer.export writes gpt_small
    gpt2 = save_folder(hf_model("gpt", **sizes), tmp_path / "gpt2")
    msg = refusal(compose_cfg, "model=gpt_small", f"model.init_from={gpt2}")
    assert "no place for: transformer.h.0.attn.c_attn.bias" in msg
    assert "add model.bias=true, or leave model= out (init_from alone)" in msg
    assert "choose the model= it was saved from" not in msg
    validate(compose_cfg("parallel=single", "model=gpt_small", "model.bias=true", f"model.init_from={gpt2}"))
