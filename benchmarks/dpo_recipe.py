"""docs/fine-tuning.md's recipe end to end, its held-out reward curves drawn from the DPO run's own metrics.jsonl.

A tiny Qwen3 written by transformers (``tests/hf_helpers.py``) with a ChatML tokenizer (``tests/chat_helpers.py``),
SFT with LoRA on 200 conversations, ``--merge`` export, then DPO with LoRA on 200 pairs whose chosen reply starts
"The answer is" and whose rejected reply is a random sentence (``data.val_fraction`` 0.1 of them held out). Writes
``dpo_recipe.json`` (every logged row of the DPO run) and ``dpo_recipe.png`` (loss, held-out loss, held-out reward
accuracy and margin against the step) under ``--out``, and prints the held-out rows.

    python benchmarks/dpo_recipe.py --out docs/img                 # 200 DPO steps, an evaluation every 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chat_helpers import VOCAB, conversations, sentence, write_jsonl, write_tokenizer  # noqa: E402
from tests.hf_helpers import hf_model, save_folder  # noqa: E402


def pairs(n: int, *, seed: int = 1) -> list[dict]:
    """Pairs whose chosen reply opens "The answer is" and whose rejected one is a random sentence."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tail = sentence(rng, int(rng.integers(1, 4)))
        out.append(
            {
                "prompt": [{"role": "user", "content": sentence(rng, int(rng.integers(3, 7)))}],
                "chosen": [{"role": "assistant", "content": "The answer is " + tail[0].lower() + tail[1:]}],
                "rejected": [{"role": "assistant", "content": sentence(rng, int(rng.integers(2, 6)))}],
            }
        )
    return out


def command(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    out = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_SILENT": "true"}
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def recipe(tmp: Path, *, sft_steps: int, dpo_steps: int, eval_every: int) -> list[dict]:
    shape = {"vocab_size": VOCAB, "max_position_embeddings": 128, "num_key_value_heads": 2, "head_dim": 32}
    base = write_tokenizer(save_folder(hf_model("qwen3", **shape), tmp / "qwen3"))
    chats = write_jsonl(tmp / "chats.jsonl", conversations(200))
    prefs = write_jsonl(tmp / "pairs.jsonl", pairs(200))
    lora = ("model.lora.rank=8", "model.lora.alpha=16", "parallel=fsdp", "logger=none")
    command("train.py", f"model.init_from={base}", "data=chat", f"data.path={chats}", *lora,
            f"trainer.max_steps={sft_steps}", "trainer.eval_every=20", "optim.lr=0.01",
            f"data.cache_dir={tmp / 'cache'}", f"hydra.run.dir={tmp / 'sft_run'}")  # fmt: skip
    command("-m", "trainer.export", str(tmp / "sft_run"), "--hf", str(tmp / "sft"), "--merge")
    command("train.py", f"model.init_from={tmp / 'sft'}", "data=preference", f"data.path={prefs}",
            "trainer.objective=dpo", *lora, f"trainer.max_steps={dpo_steps}", "trainer.log_every=5",
            f"trainer.eval_every={eval_every}", "trainer.eval_batches=2", "optim.lr=0.002", "optim.warmup_steps=0",
            "trainer.checkpoint_every=0", f"data.cache_dir={tmp / 'cache'}", f"hydra.run.dir={tmp / 'dpo_run'}")  # fmt: skip
    return rows(tmp / "dpo_run")


def plot(metrics: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [m for m in metrics if "loss" in m]
    val = [m for m in metrics if "val_rewards_accuracy" in m]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot([m["step"] for m in train], [m["loss"] for m in train], label="train loss")
    a.plot([m["step"] for m in val], [m["val_loss"] for m in val], "o-", label="held-out loss")
    a.axhline(np.log(2), color="grey", lw=0.8, ls=":", label="ln 2")
    a.set_xlabel("step")
    a.set_title("DPO loss")
    a.legend()
    b.plot([m["step"] for m in val], [m["val_rewards_accuracy"] for m in val], "o-", label="held-out reward accuracy")
    b.plot([m["step"] for m in val], [m["val_rewards_margin"] for m in val], "s-", label="held-out reward margin")
    b.axhline(0.5, color="grey", lw=0.8, ls=":", label="0.5")
    b.set_xlabel("step")
    b.set_title("held-out pairs")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--dpo-steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpo_recipe_") as tmp:
        metrics = recipe(Path(tmp), sft_steps=args.sft_steps, dpo_steps=args.dpo_steps, eval_every=args.eval_every)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dpo_recipe.json").write_text(json.dumps(metrics, indent=1) + "\n")
    plot(metrics, args.out / "dpo_recipe.png")
    print("step | loss | val loss | val reward accuracy | val reward margin")
    for m in metrics:
        if "val_rewards_accuracy" in m:
            print(
                f"{m['step']} | {m.get('loss', float('nan')):.4f} | {m['val_loss']:.4f} | "
                f"{m['val_rewards_accuracy']:.2f} | {m['val_rewards_margin']:.4f}"
            )


if __name__ == "__main__":
    main()
