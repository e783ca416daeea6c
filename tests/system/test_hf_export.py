"""``python -m trainer.export`` on checkpoints written in this process (a DCP checkpoint, its marker and its run
config, as a run leaves them): transformers loads the folder and gives meshtrain's logits to 1e-5 for each family
(tied GPT-2 layout, gpt_small's plain layout, Llama with rope scaling split into shards, Qwen3), and its tokenizer
encodes text to the ids the run trained on. No workers."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from tests.hf_helpers import max_logit_difference
from trainer.checkpoint.files import MARKER

CASES = {
    "gpt2_debug": ("model=gpt2_debug",),
    "gpt_small": ("model=gpt_small",),
    "llama_rope_scaling_sharded": (
        "model=llama_debug",
        "model.rope_scaling={factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,original_max_seq_len:16}",
    ),
    "qwen3_debug": ("model=qwen3_debug",),
}


def write_run(compose_cfg, run_dir, *overrides: str):
    """A run folder with one checkpoint of a randomly initialised model; returns (module, model config)."""
    import torch.distributed.checkpoint as dcp
    from hydra.utils import instantiate

    from models.spec import builder_kwargs

    cfg = compose_cfg("data.seq_len=32", *overrides)
    torch.manual_seed(0)
    module = instantiate(builder_kwargs(cfg.model)).eval()
    with torch.no_grad():  # random norms and biases: a mis-mapped one would show
        for name, p in module.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(0.5, 0.2)
    step = run_dir / "checkpoints" / "step_0000001"
    dcp.save({"model": module.state_dict()}, checkpoint_id=str(step), no_dist=True)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    (step / MARKER).write_text(json.dumps({"step": 1, "model": model}))
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml", resolve=True)
    return module, model


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_folder_gives_meshtrain_logits_in_transformers(compose_cfg, tmp_path, case):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.export import main

    module, model = write_run(compose_cfg, tmp_path / "run", *CASES[case])
    out = tmp_path / "hf"
    shard = ["--max-shard-size", "200KB"] if "sharded" in case else []
    assert main([str(tmp_path / "run"), "--hf", str(out), *shard]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    if shard:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1 and "model.safetensors" not in names
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    text = "def main():\n    return 'ünïcode'  # ✓"
    ids = AutoTokenizer.from_pretrained(out).encode(text)
    assert ids == list(text.encode("utf-8"))
    tokens = torch.tensor([ids[:32]])
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), hf(tokens).logits)
    print(f"{case}: exported, max |logit difference| in transformers {diff:.2e}")
    assert diff <= 1e-5


def test_export_refuses_a_folder_without_a_checkpoint(tmp_path, capsys):
    from trainer.export import main

    assert main([str(tmp_path), "--hf", str(tmp_path / "out")]) == 2
    assert "neither a checkpoint" in capsys.readouterr().err


def test_meshtrain_export_is_the_exporter(compose_cfg, tmp_path, monkeypatch):
    from trainer.command import main

    write_run(compose_cfg, tmp_path / "run", "model=gpt_small")
    out = tmp_path / "hf"
    monkeypatch.setattr("sys.argv", ["meshtrain", "export", str(tmp_path / "run"), "--hf", str(out)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0 and json.loads((out / "config.json").read_text())["model_type"] == "gpt2"


def _specials(out):
    """bos/eos/pad ids as transformers' tokenizer, config.json and generation_config.json read them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    roles = ("bos", "eos", "pad")
    return (
        {r: getattr(tok, f"{r}_token_id") for r in roles},
        {r: config.get(f"{r}_token_id") for r in roles},
        {r: generation.get(f"{r}_token_id") for r in roles},
        tok,
        config,
    )


def test_byte_vocabulary_export_names_eos_and_pad_everywhere_and_its_context_length(compose_cfg, tmp_path):
    """gpt_small with a vocabulary larger than the 256 bytes (the data is still the byte corpus) ships the byte
    tokenizer; eos (NUL stands in) and pad agree in the tokenizer, config.json and generation_config.json, and
    model_max_length is config.json's n_positions."""
    from trainer.export import main

    write_run(compose_cfg, tmp_path / "run", "model=gpt_small", "model.vocab_size=320")
    out = tmp_path / "hf"
    assert main([str(tmp_path / "run"), "--hf", str(out)]) == 0
    tok_ids, config_ids, generation_ids, tok, config = _specials(out)
    assert tok_ids == config_ids == generation_ids == {"bos": None, "eos": 0, "pad": 0}
    assert tok.model_max_length == config["n_positions"] == 32
    assert tok.encode("héllo") == list("héllo".encode())


def test_init_from_ids_and_chat_template_reach_the_tokenizer(compose_cfg, tmp_path):
    """A run that started from a folder whose config.json names bos 1 and eos 2 and whose tokenizer has a chat
    template: the exported tokenizer names those ids (no pad: eos stands in), carries the template, and its
    model_max_length is the base's longer max_position_embeddings."""
    from trainer.export import main

    _, model = write_run(compose_cfg, tmp_path / "run", "model=qwen3_debug")
    start = tmp_path / "base"
    start.mkdir()
    (start / "config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 96})
    )
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    (start / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    marker = next((tmp_path / "run").glob("checkpoints/*")) / MARKER
    marker.write_text(json.dumps({"step": 1, "model": {**model, "init_from": str(start)}}))
    out = tmp_path / "hf"
    assert main([str(tmp_path / "run"), "--hf", str(out)]) == 0
    tok_ids, config_ids, generation_ids, tok, config = _specials(out)
    assert tok_ids == config_ids == generation_ids == {"bos": 1, "eos": 2, "pad": 2}
    assert tok.model_max_length == config["max_position_embeddings"] == 96
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<user>hi"


def test_bf16_export_and_overwrite_replace_stale_shards(compose_cfg, tmp_path, capsys):
    """A non-empty folder is refused (exit 2, named); --overwrite removes the earlier sharded export's shards and
    index before writing one bf16 model.safetensors, which transformers loads as bf16 with the fp32 logits to
    bf16's precision."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from trainer.export import main

    module, _ = write_run(compose_cfg, tmp_path / "run", "model=llama_debug")
    out = tmp_path / "hf"
    assert main([str(tmp_path / "run"), "--hf", str(out), "--max-shard-size", "200KB"]) == 0
    assert (out / "model.safetensors.index.json").is_file()
    assert main([str(tmp_path / "run"), "--hf", str(out), "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert f"--hf {out}: the folder is not empty" in err and "--overwrite" in err
    assert main([str(tmp_path / "run"), "--hf", str(out), "--dtype", "bf16", "--overwrite"]) == 0
    weights = sorted(p.name for p in out.glob("*.safetensors*"))
    assert weights == ["model.safetensors"]
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.dtype == torch.bfloat16
    tokens = torch.tensor([list(b"def main(): return 1")])
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), hf(tokens).logits.float())
    print(f"bf16 export: max |logit difference| against fp32 meshtrain {diff:.2e}")
    assert diff < 0.1
