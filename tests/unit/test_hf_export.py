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
