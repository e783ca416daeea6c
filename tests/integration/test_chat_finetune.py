"""Fine-tuning on conversations (real workers): a tiny Qwen3 saved by transformers, with its tokenizer and chat
template, trained from ``model.init_from=DIR`` alone on ``data=chat`` with packed conversations; fsdp and tp give
single's losses and gradient norms, and step 1's loss is transformers' own on the same rows (prompts masked, each
conversation attending only within itself). With LoRA adapters, ddp and fsdp give single's; the base weights stay
as the folder has them, and the fsdp run's PEFT export loads in peft over the folder with meshtrain's logits. Bad
input is refused before any worker starts."""

from __future__ import annotations

import json

import pytest

from tests.chat_helpers import VOCAB, conversations, write_jsonl, write_tokenizer
from tests.helpers import assert_losses_close, case_multirun, no_checkpoint, run_train
from tests.hf_helpers import hf_model, save_folder

pytestmark = pytest.mark.slow

SEQ = 128
COMMON = ("trainer.log_every=1", "logger=none", f"data.seq_len={SEQ}", "data.global_batch_size=4")
LORA = {"lora": {"rank": 4, "alpha": 8.0, "targets": ["wq", "wv", "w2"]}}
LAYOUTS = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "tp": {"defaults": [{"override /parallel": "tp"}]},
    "lora_single": {"defaults": [{"override /parallel": "single"}], "model": LORA},
    # 2 samples per replica in 2 accumulated chunks
    "lora_ddp": {"defaults": [{"override /parallel": "ddp"}], "model": LORA, "data": {"micro_batch_size": 1}},
    "lora_fsdp": {"defaults": [{"override /parallel": "fsdp"}], "model": LORA},
    # the adapters split as their base: wq, wv column-wise (A whole, B's rows), w2 row-wise (A's columns, B whole);
    # Qwen3's q/k head norms (torch's SequenceParallel over heads) stay frozen
    "lora_tp": {"defaults": [{"override /parallel": "tp"}], "model": LORA},
    # the hybrid: dp 2 (FSDP2) x tp 2 on one mesh (packed documents need pp.size=1)
    "lora_hybrid": {"defaults": [{"override /parallel": "hybrid"}], "pp": {"size": 1}, "model": LORA},
}


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A transformers Qwen3 folder with the chat tokenizer beside its weights, and a JSONL of conversations."""
    root = tmp_path_factory.mktemp("chat")
    hf = hf_model("qwen3", vocab_size=VOCAB, max_position_embeddings=SEQ, num_key_value_heads=2, head_dim=32)
    folder = save_folder(hf, root / "qwen3")
    write_tokenizer(folder)
    chats = write_jsonl(root / "chats.jsonl", conversations(40))
    return folder, chats


@pytest.fixture(scope="module")
def runs(start, tmp_path_factory):
    folder, chats = start
    data = {"path": str(chats), "packing": "documents", "cache_dir": str(folder.parent / "cache")}
    cases = {name: {**layout, "data": {**data, **layout.get("data", {})}} for name, layout in LAYOUTS.items()}
    # the LoRA single and fsdp runs' checkpoints are read back and exported; the others' metrics are compared
    cases = {name: c if name in ("lora_single", "lora_fsdp") else no_checkpoint(c) for name, c in cases.items()}
    steps = ("trainer.max_steps=3", "trainer.eval_every=3", "trainer.eval_batches=1", "optim.lr=0.01")
    return case_multirun(
        cases,
        "data=chat",
        f"model.init_from={folder}",
        *COMMON,
        *steps,
        base=tmp_path_factory.mktemp("runs"),
        group="chat",
        timeout=900,
    )


def metrics(job) -> list[dict]:
    return [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_step_one_is_transformers_loss_on_the_packed_rows(runs, start):
    """transformers' Qwen3 on each packed conversation alone (its own sequence, masked prompt tokens): the token
    mean over the batch equals meshtrain's packed step-1 loss."""
    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    cfg = OmegaConf.load(runs["single"] / ".hydra" / "config.yaml")
    assert cfg.model.family == "qwen3" and cfg.data.packing == "documents"
    data = instantiate(cfg.data, seed=int(cfg.trainer.seed))
    inputs, targets = data.global_batch(1)
    hf = AutoModelForCausalLM.from_pretrained(start[0]).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in range(inputs.shape[0]):
            ids, positions, y = inputs[row, 0], inputs[row, 1], targets[row]
            starts = [int(i) for i in torch.nonzero(positions == 0)] + [len(ids)]
            for a, b in zip(starts, starts[1:]):
                logits = hf(ids[None, a:b]).logits[0]
                total += float(torch.nn.functional.cross_entropy(logits, y[a:b], ignore_index=-100, reduction="sum"))
                count += int((y[a:b] != -100).sum())
    got = metrics(runs["single"])[0]["loss"]
    print(f"step 1: meshtrain {got:.6f}, transformers on each conversation alone {total / count:.6f} ({count} targets)")
    assert got == pytest.approx(total / count, rel=1e-5)
    assert count < int((inputs[:, 0] != data.metadata["tokenizer"]["pad_id"]).sum())  # prompts were masked


@pytest.mark.parametrize("case, ref", [("fsdp", "single"), ("tp", "single"), ("lora_ddp", "lora_single"),
                                       ("lora_fsdp", "lora_single"), ("lora_tp", "lora_single"),
                                       ("lora_hybrid", "lora_single")])  # fmt: skip
def test_layouts_match_single_on_packed_chats(runs, case, ref):
    name, ref, got = ref, metrics(runs[ref]), metrics(runs[case])
    assert len(got) == 3
    for key in ("loss", "grad_norm"):
        print(f"{case} {key}: {[m[key] for m in got]}, {name}: {[m[key] for m in ref]}")
    print(f"{case} val_loss {got[-1]['val_loss']}, {name} {ref[-1]['val_loss']}")
    assert_losses_close([m["loss"] for m in got], [m["loss"] for m in ref], rel=1e-5)
    assert_losses_close([m["grad_norm"] for m in got], [m["grad_norm"] for m in ref], rel=1e-4)
    assert got[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], rel=1e-5)


def test_a_bad_conversation_is_refused_before_any_worker(start, tmp_path):
    folder, _ = start
    bad = write_jsonl(tmp_path / "bad.jsonl", [*conversations(2), {"messages": [{"role": "user", "content": "hi"}]}])
    run = run_train(
        "parallel=ddp", "data=chat", f"data.path={bad}", f"model.init_from={folder}", *COMMON,
        f"data.cache_dir={tmp_path / 'cache'}", run_dir=tmp_path / "run", expect_ok=False,
    )  # fmt: skip
    assert run.proc.returncode == 2, run.output[-3000:]
    assert f"{bad}:3: no assistant reply: nothing to train on" in run.output
    assert not (tmp_path / "run" / "logs" / "rank0.log").exists()


def test_packing_under_a_pipeline_is_refused(start, tmp_path):
    folder, chats = start
    run = run_train(
        "parallel=pp", "data=chat", f"data.path={chats}", "data.packing=documents", f"model.init_from={folder}",
        *COMMON, run_dir=tmp_path / "run", expect_ok=False,
    )  # fmt: skip
    assert run.proc.returncode == 2, run.output[-3000:]
    assert "data.packing=documents with pp.size=2" in run.output


def test_lora_trains_the_adapters_only_and_exports_a_peft_folder(runs, start, tmp_path):
    """The fsdp LoRA run: its checkpoint holds the folder's base weights unchanged and trained adapters; the PEFT
    export, loaded by peft over the folder, gives the logits of meshtrain's model with those adapters."""
    import torch
    from hydra.utils import instantiate
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from models.lora import LoRA, apply_lora, is_adapter
    from models.registry import spec_for
    from models.spec import builder_kwargs
    from tests.hf_helpers import checkpoint_tensors, max_logit_difference
    from trainer.checkpoint.files import read_marker
    from trainer.export import export, find_checkpoint, full_state

    folder = start[0]
    full, lora = metrics(runs["single"]), metrics(runs["lora_single"])
    assert full[0]["loss"] == pytest.approx(lora[0]["loss"], rel=1e-6)  # B = 0: step 1 is the base model's loss
    assert lora[-1]["loss"] < lora[0]["loss"]
    # frozen weights: no gradients, no optimizer state (AdamW's two moments of the adapters only)
    state_full, state_lora = (json.loads((runs[c] / "summary.json").read_text()) for c in ("single", "lora_single"))
    saved = full_state(find_checkpoint(runs["lora_single"]))
    adapters = 4 * sum(v.numel() for k, v in saved.items() if is_adapter(k))  # fp32 bytes
    held = state_lora["model_state_bytes_per_rank"][0]
    print(f"lora_single: {state_lora['model_init']['lora_modules']} adapted layers, state bytes {held}")
    assert state_lora["model_init"]["lora_modules"] == 6
    assert held["grads"] == adapters and held["optimizer"] == 2 * adapters
    assert state_full["model_state_bytes_per_rank"][0]["grads"] > 10 * adapters
    checkpoint = find_checkpoint(runs["lora_fsdp"])
    model = read_marker(checkpoint)["model"]
    state = full_state(checkpoint)
    module = instantiate(builder_kwargs(model)).eval()
    apply_lora(module, LoRA.of(model))
    module.load_state_dict(state)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    adapter = spec_for(model).hf_adapter_obj()
    base = adapter.to_hf({k: v for k, v in state.items() if not is_adapter(k)}, model)
    original = checkpoint_tensors(hf)
    assert max(float((base[k] - original[k]).abs().max()) for k in original) == 0.0  # frozen: bit for bit
    assert all(float(state[k].abs().max()) > 0 for k in state if ".lora_B." in k)  # trained from zero
    out = export(runs["lora_fsdp"], tmp_path / "adapter")
    peft = PeftModel.from_pretrained(hf, out).eval()
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = max_logit_difference(module(tokens), peft(tokens).logits)
    print(f"lora_fsdp: PEFT export over the base folder, max |logit difference| {diff:.2e}")
    assert diff <= 1e-5


def test_the_merged_lora_export_runs_in_lm_eval(runs, tmp_path):
    """The fsdp LoRA run folded into a whole model (``--merge``), with the folder's tokenizer and chat template:
    lm-evaluation-harness runs on it with no argument but the folder."""
    from tests.hf_helpers import run_lm_eval
    from trainer.export import main

    out = tmp_path / "merged"
    assert main([str(runs["lora_fsdp"]), "--hf", str(out), "--merge"]) == 0
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template  # the folder's template came along
    done = run_lm_eval(out, tmp_path / "tasks")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "meshtrain_tiny_mc" in done.stdout and "acc" in done.stdout
