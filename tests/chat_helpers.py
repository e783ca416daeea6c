"""A tiny tokenizer with a chat template and conversations written locally (no download), for the data=chat tests:
a byte-level BPE trained here, ChatML-style turns (``<|im_start|>role\\n...<|im_end|>\\n``), as Qwen's template
renders them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB = 300
WORDS = "the a pipeline shard tensor rank loss mask chat reply question answer why how what is are".split()


def sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n)).capitalize() + "."


def conversations(n: int, *, seed: int = 0, max_words: int = 8) -> list[dict]:
    """``n`` conversations: some with a system prompt, some with two exchanges, replies of varying length."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": sentence(rng, 3)}] if i % 3 == 0 else []
        for _ in range(1 + i % 2):
            messages.append({"role": "user", "content": sentence(rng, int(rng.integers(2, max_words)))})
            messages.append({"role": "assistant", "content": sentence(rng, int(rng.integers(1, max_words)))})
        out.append({"messages": messages})
    return out


#: data=preference's sequence length in the preference tests
PREFERENCE_SEQ = 64


def preference_pairs(n: int, *, seed: int = 0) -> list[dict]:
    """``n`` conversational preference pairs in TRL's form: a user prompt, a chosen and a rejected reply."""
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt": [{"role": "user", "content": sentence(rng, 4)}],
            "chosen": [{"role": "assistant", "content": sentence(rng, 3)}],
            "rejected": [{"role": "assistant", "content": sentence(rng, 5)}],
        }
        for _ in range(n)
    ]


def preference_data(rows: list, tokenizer: Path, tmp_path: Path, **kw: Any):
    """A ``PreferenceData`` over ``rows`` written to ``tmp_path``: 4 sequences of ``PREFERENCE_SEQ`` tokens a step,
    nothing held out, unless ``kw`` says otherwise."""
    from trainer.data.preference import PreferenceData

    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    kw = {"global_batch_size": 4, "seq_len": PREFERENCE_SEQ, "val_fraction": 0.0, **kw}
    return PreferenceData(path=str(path), tokenizer=str(tokenizer), cache_dir=str(tmp_path / "cache"), **kw)


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_tokenizer(folder: Path, *, template: str | None = TEMPLATE) -> Path:
    """A byte-level BPE of ``VOCAB`` tokens (its last three the specials) saved by transformers into ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = np.random.default_rng(1)
    tok.train_from_iterator([sentence(rng, 12) for _ in range(200)] + ["system user assistant"] * 20, trainer)
    kwargs = {"chat_template": template} if template else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", **kwargs)
    fast.save_pretrained(folder)
    return folder
