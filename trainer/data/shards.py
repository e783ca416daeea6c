"""The on-disk format of a prepared token dataset, and reading it back (numpy only: no torch).

A dataset folder written by ``python -m trainer.data.prepare`` holds::

    metadata.json            written last: its presence means every shard it lists is complete
    tokenizer.json           the HF tokenizers file the tokens came from
    train_00000.bin ...      raw little-endian token ids (uint16 or uint32), one document after
    validation_00000.bin     another, each followed by the EOS id

Shards are plain arrays, so ``np.memmap`` opens them without reading them and ranks share the pages.
Every check a run needs before its workers start (a shard missing, empty or truncated, metadata that
does not match the shards, the tokenizer's vocabulary) is here and raises ``DataError`` naming the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "meshtrain-token-shards"
VERSION = 1
METADATA = "metadata.json"
SPLITS = ("train", "validation")


class DataError(ValueError):
    """A data file is missing, unreadable or inconsistent with the model; the message names it."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


@dataclass
class TokenStream:
    """Shards of one split seen as one long token array (windows may cross shard boundaries)."""

    arrays: list[np.ndarray]

    def __post_init__(self) -> None:
        sizes = [len(a) for a in self.arrays]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """int64 array (len(starts), length): the tokens at ``start .. start+length`` for each start."""
        out = np.empty((len(starts), length), dtype=np.int64)
        if len(self.arrays) == 1:
            arr = self.arrays[0]
            for i, s in enumerate(starts):
                out[i] = arr[s : s + length]
            return out
        shard_of = np.searchsorted(self.offsets, starts, side="right") - 1
        for i, (s, k) in enumerate(zip(starts, shard_of)):
            pos, filled = int(s - self.offsets[k]), 0
            while filled < length:
                arr = self.arrays[k]
                take = min(length - filled, len(arr) - pos)
                out[i, filled : filled + take] = arr[pos : pos + take]
                filled += take
                k, pos = k + 1, 0
        return out


def read_metadata(folder: Path) -> dict[str, Any]:
    path = folder / METADATA
    if not folder.is_dir():
        raise DataError(
            f"data.path={folder}: no such folder; prepare one with `python -m trainer.data.prepare "
            f"--input <your files> --output {folder}`"
        )
    if not path.is_file():
        raise DataError(
            f"data.path={folder}: no {METADATA} (not a prepared dataset, or its preparation did not finish); "
            f"run `python -m trainer.data.prepare --input <your files> --output {folder}`"
        )
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise DataError(f"{path} cannot be read as JSON ({exc}); prepare the dataset again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{path} is not a {FORMAT} metadata file; prepare the dataset again")
    if meta.get("version") != VERSION:
        raise DataError(f"{path}: format version {meta.get('version')}, this meshtrain reads {VERSION}; prepare again")
    for key in ("dtype", "tokenizer", "splits"):
        if key not in meta:
            raise DataError(f"{path}: key '{key}' missing; prepare the dataset again")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: dtype {meta['dtype']!r}; expected uint16 or uint32")
    problem = layout_problem(meta)
    if problem:
        raise DataError(f"{path}: {problem}; the file was edited or damaged: prepare the dataset again")
    return meta


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def layout_problem(meta: dict[str, Any]) -> str | None:
    """What in a metadata file's tokenizer and splits a reader could not use (None: nothing)."""
    tok = meta["tokenizer"]
    if not isinstance(tok, dict) or not isinstance(tok.get("file"), str):
        return f"'tokenizer' is {tok!r}, not an object naming its file"
    for key in ("vocab_size", "eos_id"):
        if not _count(tok.get(key)):
            return f"tokenizer {key} is {tok.get(key)!r}, not a count"
    splits = meta["splits"]
    if not isinstance(splits, dict):
        return f"'splits' is {splits!r}, not an object of splits"
    for split, entry in splits.items():
        if not isinstance(entry, dict) or not _count(entry.get("tokens")) or not isinstance(entry.get("shards"), list):
            return f"split {split!r} is {entry!r}, not {{'tokens': N, 'shards': [...]}}"
        for shard in entry["shards"]:
            if not isinstance(shard, dict) or not isinstance(shard.get("file"), str) or not _count(shard.get("tokens")):
                return f"a shard of split {split!r} is {shard!r}, not {{'file': NAME, 'tokens': N}}"
    return None


def check_shards(folder: Path, meta: dict[str, Any]) -> None:
    """Every shard the metadata lists exists, is non-empty and holds exactly the tokens it says."""
    itemsize = np.dtype(meta["dtype"]).itemsize
    fix = "prepare the dataset again (python -m trainer.data.prepare ... --output " + str(folder) + ")"
    for split in SPLITS:
        entry = meta["splits"].get(split)
        if entry is None:
            raise DataError(f"{folder / METADATA}: no '{split}' split; {fix}")
        total = 0
        for shard in entry.get("shards", []):
            path = folder / shard["file"]
            if not path.is_file():
                raise DataError(f"shard {path} is missing (listed in {METADATA}); {fix}")
            size = path.stat().st_size
            if size == 0:
                raise DataError(f"shard {path} is empty; {fix}")
            want = int(shard["tokens"]) * itemsize
            if size != want:
                what = "truncated" if size < want else "longer than recorded"
                raise DataError(
                    f"shard {path} is {what}: {size} bytes, but {METADATA} records {shard['tokens']} "
                    f"{meta['dtype']} tokens ({want} bytes); {fix}"
                )
            total += int(shard["tokens"])
        if total != int(entry.get("tokens", -1)):
            raise DataError(
                f"{folder / METADATA}: the {split} split records {entry.get('tokens')} tokens but its shards "
                f"hold {total}; {fix}"
            )
    if int(meta["splits"]["train"]["tokens"]) == 0:
        raise DataError(f"{folder}: the train split is empty; {fix} with more input")


def open_split(folder: Path, meta: dict[str, Any], split: str) -> TokenStream:
    dtype = np.dtype(meta["dtype"])
    arrays = [
        np.memmap(folder / s["file"], dtype=dtype, mode="r", shape=(int(s["tokens"]),))
        for s in meta["splits"][split]["shards"]
    ]
    return TokenStream(arrays)
