"""The tokenizer an exported model ships with: the one its run's data was encoded with, in a form transformers'
``AutoTokenizer`` loads, so that text encodes to the ids the model was trained on.

- ``data=tokens``: the prepared dataset's ``tokenizer.json`` (``trainer/data/prepare.py``); when it came from a
  Hugging Face model folder (``--tokenizer DIR``), that folder's ``tokenizer_config.json`` and
  ``special_tokens_map.json`` come along;
- ``data=text`` (UTF-8 bytes are the ids): a byte-level tokenizer whose vocabulary maps each byte to its own
  value, without merges or added tokens, so ``encode(text) == list(text.encode("utf-8"))``;
- otherwise (a pre-tokenised token file, or no run config beside the checkpoint): the tokenizer of the folder
  the run started from (``model.init_from``), if it has one; else none, and the exporter says so.

``reconcile`` then makes the tokenizer and config.json tell one story, as clients read both (lm-eval takes its
end-of-text from the tokenizer, vLLM and ``generate`` from the configs): bos/eos/pad named by one of them are
named by the other with the same id, pad falls back to eos, ``model_max_length`` is the model's context length,
and a chat template of the folder the run started from comes along.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trainer.data.shards import read_metadata
from trainer.data.user_files import read_json_object, read_tokenizer
from trainer.hf.folder import HFFolderError

TOKENIZER = "tokenizer.json"
#: what a Hugging Face folder may carry beside tokenizer.json to describe it
COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
TOKENIZER_CONFIG = COMPANIONS[0]
#: every file this module writes into an export (removed first by ``--overwrite``)
TOKENIZER_FILES = (TOKENIZER, *COMPANIONS)
#: the special tokens config.json and the tokenizer both name, by role
ROLES = ("bos", "eos", "pad")
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
    if name == "text" and not str(data.get("path") or "").endswith((".npy", ".bin")):
        byte_tokenizer().save(str(out / TOKENIZER))
        (out / COMPANIONS[0]).write_text(json.dumps(tokenizer_config(max_length=max_length, eos=None), indent=2))
        return {"source": "byte vocabulary (UTF-8 bytes are the ids)", "eos_token_id": None, "default_eos": 0}
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
    return read_tokenizer(a, error=HFFolderError).to_str() == read_tokenizer(b, error=HFFolderError).to_str()


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
        json.dumps(tokenizer_config(max_length=max_length, eos=tok.get("eos_token")), indent=2)
    )
    return {"source": f"{folder} ({tok.get('source')})", "eos_token_id": int(tok["eos_id"])}


def _token(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def reconcile(
    out: Path, config: dict[str, Any], *, context: int, start: Path | None, default_eos: int | None = None
) -> dict[str, int | None]:
    """Make ``out``'s tokenizer and ``config`` (config.json, edited in place) agree on bos/eos/pad, the tokenizer's
    ``model_max_length`` equal ``context``, and carry the chat template of ``start`` (the folder the run started
    from) when the tokenizer has none. The tokenizer's own ids win where both name one (the data was encoded
    with it). ``default_eos``: the id standing for end-of-text when neither names one (the byte vocabulary has
    none; NUL, id 0, which text does not hold, stands in, since lm-eval and ``generate`` need one). Returns the
    ids by role (``bos_token_id``...)."""
    tok = read_tokenizer(out / TOKENIZER, error=HFFolderError)
    path = out / TOKENIZER_CONFIG
    tcfg = (
        read_json_object(path, error=HFFolderError)
        if path.is_file()
        else {"tokenizer_class": "PreTrainedTokenizerFast"}
    )
    ids: dict[str, int | None] = {}
    for role in ROLES:
        named = _token(tcfg.get(f"{role}_token"))
        have = tok.token_to_id(named) if named is not None else None
        want = config.get(f"{role}_token_id")
        if have is None and isinstance(want, int) and 0 <= want < tok.get_vocab_size(with_added_tokens=True):
            tcfg[f"{role}_token"] = tok.id_to_token(want)
            have = want
        if have is None and role == "eos" and default_eos is not None:
            tcfg["eos_token"], have = tok.id_to_token(default_eos), default_eos
        ids[f"{role}_token_id"] = have
    if ids["pad_token_id"] is None and ids["eos_token_id"] is not None:
        tcfg["pad_token"], ids["pad_token_id"] = tcfg["eos_token"], ids["eos_token_id"]
    for role in ROLES:
        if ids[f"{role}_token_id"] is None:
            tcfg.pop(f"{role}_token", None)
    tcfg["model_max_length"] = int(context)
    if start is not None and "chat_template" not in tcfg and not (out / COMPANIONS[2]).is_file():
        template = chat_template(start)
        if template is not None:
            tcfg["chat_template"] = template
    path.write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")
    specials = out / COMPANIONS[1]
    if specials.is_file():  # transformers reads its roles too: the same ones
        roles = {
            k: v
            for k, v in read_json_object(specials, error=HFFolderError).items()
            if k not in {f"{r}_token" for r in ROLES}
        }
        roles.update({f"{r}_token": tcfg[f"{r}_token"] for r in ROLES if f"{r}_token" in tcfg})
        specials.write_text(json.dumps(roles, indent=2, ensure_ascii=False) + "\n")
    config.update(ids)
    return ids


def chat_template(folder: Path) -> str | None:
    """The chat template a Hugging Face folder carries (chat_template.jinja, or tokenizer_config.json's key)."""
    if (folder / COMPANIONS[2]).is_file():
        return (folder / COMPANIONS[2]).read_text()
    cfg = folder / TOKENIZER_CONFIG
    template = read_json_object(cfg, error=HFFolderError).get("chat_template") if cfg.is_file() else None
    return template if isinstance(template, str) else None
