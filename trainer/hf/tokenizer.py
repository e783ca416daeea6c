"""The tokenizer an exported model ships with: the one its run's data was encoded with, in a form transformers'
``AutoTokenizer`` loads, so that text encodes to the ids the model was trained on.

- ``data=tokens``: the prepared dataset's ``tokenizer.json`` (``trainer/data/prepare.py``); when it came from a
  Hugging Face model folder (``--tokenizer DIR``), that folder's ``tokenizer_config.json`` and
  ``special_tokens_map.json`` come along;
- ``data=text`` (UTF-8 bytes are the ids): a byte-level tokenizer whose vocabulary maps each byte to its own
  value, without merges or added tokens, so ``encode(text) == list(text.encode("utf-8"))``;
- otherwise (a pre-tokenised token file, or no run config beside the checkpoint): the tokenizer of the folder
  the run started from (``model.init_from``), if it has one; else none, and the exporter says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trainer.data.shards import read_metadata

TOKENIZER = "tokenizer.json"
#: what a Hugging Face folder may carry beside tokenizer.json to describe it
COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json")
BYTES = 256


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte, the alphabet of byte-level BPE tokenizers."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(BYTES):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(BYTES + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A ``tokenizers.Tokenizer`` whose id for every byte is the byte's value (meshtrain's byte vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: b for b, char in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def tokenizer_config(*, max_length: int, eos: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    return {**cfg, "eos_token": eos} if eos else cfg


def write_tokenizer(out: Path, *, data: Any, model: Any) -> dict[str, Any] | None:
    """Write the run's tokenizer into ``out``; returns where it came from and its end-of-text id (None: none)."""
    max_length = int(model.get("max_seq_len") or 0) or 1024
    name = data.get("name") if data is not None else None
    if name == "tokens" and data.get("path"):
        return _prepared(out, Path(str(data["path"])).expanduser(), max_length=max_length)
    if (
        name == "text"
        and int(model["vocab_size"]) == BYTES
        and not str(data.get("path") or "").endswith((".npy", ".bin"))
    ):
        byte_tokenizer().save(str(out / TOKENIZER))
        (out / COMPANIONS[0]).write_text(json.dumps(tokenizer_config(max_length=max_length, eos=None), indent=2))
        return {"source": "byte vocabulary (UTF-8 bytes are the ids)", "eos_token_id": None}
    start = model.get("init_from")
    if start and (Path(str(start)).expanduser() / TOKENIZER).is_file():
        folder = Path(str(start)).expanduser()
        for file in (TOKENIZER, *COMPANIONS):
            if (folder / file).is_file():
                shutil.copyfile(folder / file, out / file)
        return {"source": f"{folder} (model.init_from)", "eos_token_id": None}
    return None


def same_tokenizer(a: Path, b: Path) -> bool:
    """Whether two tokenizer.json files hold one tokenizer (prepare re-serialises the one it was given)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(a)).to_str() == Tokenizer.from_file(str(b)).to_str()


def _prepared(out: Path, folder: Path, *, max_length: int) -> dict[str, Any]:
    tok = read_metadata(folder)["tokenizer"]
    shutil.copyfile(folder / tok["file"], out / TOKENIZER)
    origin = Path(str(tok.get("source", "")))
    if origin.name == TOKENIZER and origin.is_file() and same_tokenizer(origin, folder / tok["file"]):
        copied = [f for f in COMPANIONS if (origin.parent / f).is_file()]
        for file in copied:
            shutil.copyfile(origin.parent / file, out / file)
        if copied:
            return {"source": str(origin.parent), "eos_token_id": int(tok["eos_id"])}
    (out / COMPANIONS[0]).write_text(
        json.dumps(tokenizer_config(max_length=max_length, eos=tok["eos_token"]), indent=2)
    )
    return {"source": f"{folder} ({tok.get('source')})", "eos_token_id": int(tok["eos_id"])}
