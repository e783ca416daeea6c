"""Data sources whose global batch for step k depends only on (seed, step).

That makes every layout see the same samples at the same step, so losses are comparable across
strategies, and resuming needs no loader state beyond the step number. Each rank draws the global
batch's indices (cheap) and keeps its own shard; token files are memory-mapped, so ranks share pages.

Text sources (``TextCorpus``: bytes; ``TokenShards``: a dataset prepared by ``trainer.data.prepare``)
hold out a validation split: ``val_batch(i)`` is the i-th batch of consecutive, non-overlapping windows
of the held-out tokens, the same on every rank and every evaluation.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from trainer.data.packing import PACKINGS, window_documents
from trainer.data.shards import DataError, TokenStream, check_shards, open_split, read_metadata
from trainer.observe.durable import write_bytes_atomic
from trainer.observe.startup import Steps

__all__ = ["DataError", "SyntheticImages", "TextCorpus", "TokenShards"]


def _sources_in_order(folder: Path) -> Iterator[Path]:
    """The ``*.py`` files under ``folder`` in ``sorted(folder.rglob("*.py"))``'s order (paths compare part by part, so
    each folder's entries by name, a subfolder's files at its name's place), found lazily: the default corpus stops
    after its first 200 kB, where sorting the whole walk had listed every file under the interpreter's lib folder
    first (its site-packages included, ~5 s on this machine). Symlinked folders and site-packages are not entered."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if is_dir:
            if entry.name != "site-packages":
                yield from _sources_in_order(Path(entry.path))
        elif entry.name.endswith(".py"):
            yield Path(entry.path)


def _stdlib_sources(max_bytes: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    steps = Steps(f"reading the default corpus from {root}", unit="bytes", total=max_bytes)
    chunks, total = [], 0
    for path in _sources_in_order(root):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        steps.advance(len(data), note=f"{len(chunks):,} files")
        if total >= max_bytes:
            break
    steps.end(f"{min(total, max_bytes):,} bytes from {len(chunks):,} files")
    return b"".join(chunks)[:max_bytes]


class WindowBatches:
    """Random training windows of ``seq_len + 1`` tokens drawn from (seed, step); validation windows in order.

    Subclasses provide ``train_stream``, ``val_stream`` (``TokenStream``) and ``describe`` (for errors).
    """

    global_batch_size: int
    seq_len: int
    seed: int
    describe: str
    packing: str = "none"
    """``documents``: positions restart and attention stops at each EOS (``trainer/data/packing.py``)."""
    #: what throughput counts (the console's tok/s)
    unit = "tokens"

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def train_stream(self) -> TokenStream:
        raise NotImplementedError

    @property
    def val_stream(self) -> TokenStream:
        raise NotImplementedError

    def _check_length(self, stream: TokenStream, what: str) -> None:
        if len(stream) < self.seq_len + 2:
            raise DataError(
                f"{self.describe}: the {what} split holds {len(stream)} tokens, fewer than data.seq_len+2="
                f"{self.seq_len + 2}; use more data or a smaller data.seq_len"
            )

    def global_batch(self, step: int):
        """(inputs, targets) of shape (global_batch_size, seq_len) for ``step``, identical on every rank."""
        stream = self.train_stream
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(stream) - self.seq_len - 1, size=self.global_batch_size)
        return self._pairs(stream.windows(starts, self.seq_len + 1))

    def _pairs(self, windows: np.ndarray):
        """(inputs, targets) of windows of ``seq_len + 1`` tokens; packed documents' positions with them."""
        import torch

        inputs, targets = windows[:, :-1], windows[:, 1:]
        if self.packing == "documents":
            inputs, targets = window_documents(inputs, targets, eos_id=self.eos_id)
        return torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(np.ascontiguousarray(targets))

    @property
    def eos_id(self) -> int:
        raise DataError(f"{self.describe}: no end-of-document token, so data.packing=documents cannot find documents")

    def val_windows(self) -> int:
        """Non-overlapping validation windows (0 when there is no validation split)."""
        n = len(self.val_stream)
        return max(0, (n - 1) // self.seq_len) if n >= self.seq_len + 1 else 0

    def val_batch(self, index: int):
        """The ``index``-th validation batch: consecutive windows, wrapping around a short split."""
        n = self.val_windows()
        if n == 0:
            raise DataError(f"{self.describe}: no validation split to evaluate on")
        ids = (index * self.global_batch_size + np.arange(self.global_batch_size)) % n
        return self._pairs(self.val_stream.windows(ids * self.seq_len, self.seq_len + 1))

    def check_validation(self, *, eval_every: int, eval_batches: int) -> str | None:
        """Refuse evaluation without a validation split; returns a warning when batches repeat windows."""
        if eval_every <= 0:
            return None
        n = self.val_windows()
        if n == 0:
            raise DataError(
                f"{self.describe}: the validation split is empty ({len(self.val_stream)} tokens, a window needs "
                f"data.seq_len+1={self.seq_len + 1}) but trainer.eval_every={eval_every}; hold out more data "
                "(prepare with a larger --val-fraction, or data.val_fraction for text) or set trainer.eval_every=0"
            )
        wanted = eval_batches * self.global_batch_size
        if wanted > n:
            return (
                f"trainer.eval_batches={eval_batches} x data.global_batch_size={self.global_batch_size} = {wanted} "
                f"validation windows, but the split holds {n}: windows repeat (the loss is still exact over them)"
            )
        return None


class TextCorpus(WindowBatches):
    """Byte-level (or pre-tokenised) text; the last ``val_fraction`` of the tokens is the validation split."""

    def __init__(
        self,
        *,
        global_batch_size: int,
        seq_len: int,
        path: str | None = None,
        cache_dir: str = "~/.cache/meshtrain",
        max_bytes: int = 4_000_000,
        val_fraction: float = 0.05,
        micro_batch_size: int | None = None,
        seed: int = 0,
        name: str = "text",
        packing: str = "none",
    ):
        if packing != "none":
            raise DataError(
                f"data.packing={packing}: data=text is one stream of bytes without document boundaries; pack "
                "documents from data=tokens (prepared files, each document ended by the EOS) or data=chat"
            )
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.path = Path(os.path.expanduser(path)) if path else None
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.max_bytes = max_bytes
        self.val_fraction = val_fraction
        self._tokens: np.ndarray | None = None

    @property
    def source(self) -> Path:
        if self.path is not None:
            return self.path
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.cache_dir / f"stdlib-py{ver}-{self.max_bytes}.u8"

    @property
    def describe(self) -> str:
        return f"data file {self.source}"

    def prepare(self) -> None:
        """Build the stdlib token cache once (launcher process, before workers start)."""
        if self.path is None and not self.source.exists():
            write_bytes_atomic(self.source, _stdlib_sources(self.max_bytes))

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = self._load(self.source)
            if len(self._tokens) < self.seq_len + 2:
                raise DataError(
                    f"data file {self.source} holds {len(self._tokens)} tokens, fewer than "
                    f"data.seq_len+2={self.seq_len + 2}; use a larger file or a smaller data.seq_len"
                )
        return self._tokens

    @property
    def _val_start(self) -> int:
        return len(self.tokens) - int(len(self.tokens) * self.val_fraction)

    @property
    def train_stream(self) -> TokenStream:
        return TokenStream([self.tokens[: self._val_start]])

    @property
    def val_stream(self) -> TokenStream:
        return TokenStream([self.tokens[self._val_start :]])

    @staticmethod
    def _load(path: Path) -> np.ndarray:
        if not path.exists():
            raise DataError(f"data file {path} does not exist; set data.path to an existing file")
        try:
            if path.suffix == ".npy":
                arr = np.load(path, mmap_mode="r")
                if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
                    raise DataError(f"data file {path}: expected a 1-D integer token array, got {arr.dtype}{arr.shape}")
                return arr
            if path.suffix == ".bin":
                if path.stat().st_size % 2:
                    raise DataError(f"data file {path}: .bin token files hold uint16 tokens, but its size is odd")
                return np.memmap(path, dtype=np.uint16, mode="r")
            return np.memmap(path, dtype=np.uint8, mode="r")  # UTF-8 bytes are the tokens
        except DataError:
            raise
        except (ValueError, OSError) as exc:
            raise DataError(f"data file {path} cannot be read as tokens: {exc}") from None

    def check_vocab(self, vocab_size: int) -> None:
        top = int(self.tokens.max())
        if top >= vocab_size:
            raise DataError(
                f"data file {self.source} holds token id {top} but model.vocab_size={vocab_size}; "
                f"set model.vocab_size={top + 1} or larger"
            )
        self._check_length(self.train_stream, "train")


class TokenShards(WindowBatches):
    """A dataset folder written by ``python -m trainer.data.prepare`` (``data=tokens data.path=DIR``)."""

    def __init__(
        self,
        *,
        path: str | None,
        global_batch_size: int,
        seq_len: int,
        micro_batch_size: int | None = None,
        seed: int = 0,
        name: str = "tokens",
        packing: str = "none",
    ):
        if not path:
            raise DataError(
                "data=tokens needs data.path=<folder written by `python -m trainer.data.prepare`>; "
                "or use data=text (byte-level, no preparation)"
            )
        if packing not in PACKINGS:
            raise DataError(f"data.packing={packing}: use one of {', '.join(PACKINGS)}")
        self.folder = Path(os.path.expanduser(str(path))).resolve()
        self.packing = packing
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.seed = seed
        self._meta: dict | None = None
        self._streams: dict[str, TokenStream] = {}

    @property
    def describe(self) -> str:
        return f"dataset {self.folder}"

    @property
    def metadata(self) -> dict:
        if self._meta is None:
            self._meta = read_metadata(self.folder)
        return self._meta

    def prepare(self) -> None:
        """Check the folder before any worker starts: metadata readable, every shard whole, train long enough."""
        meta = read_metadata(self.folder)
        check_shards(self.folder, meta)
        self._meta = meta
        self._check_length(self.train_stream, "train")

    def _stream(self, split: str) -> TokenStream:
        if split not in self._streams:
            self._streams[split] = open_split(self.folder, self.metadata, split)
        return self._streams[split]

    @property
    def train_stream(self) -> TokenStream:
        return self._stream("train")

    @property
    def val_stream(self) -> TokenStream:
        return self._stream("validation")

    @property
    def vocab_size(self) -> int:
        return int(self.metadata["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.metadata["tokenizer"]["eos_id"])

    def check_vocab(self, vocab_size: int) -> None:
        tok = self.metadata["tokenizer"]
        if self.vocab_size > vocab_size:
            raise DataError(
                f"{self.describe}: its tokenizer ({tok['file']}, {tok.get('source')}) has {self.vocab_size} tokens "
                f"but model.vocab_size={vocab_size}; set model.vocab_size={self.vocab_size} (or larger)"
            )


class SyntheticImages:
    """Class-conditional images: a fixed random prototype per class plus fresh noise each step."""

    def __init__(
        self,
        *,
        global_batch_size: int,
        image_size: int = 16,
        channels: int = 3,
        num_classes: int = 10,
        noise: float = 0.5,
        seed: int = 0,
        seq_len: int = 1,
        micro_batch_size: int | None = None,
        path: str | None = None,
        name: str = "images",
    ):
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.noise = noise
        self.num_classes = num_classes
        proto_rng = np.random.default_rng([seed, 2**31 - 1])
        self.prototypes = proto_rng.standard_normal((num_classes, channels, image_size, image_size)).astype(np.float32)

    tokens_per_sample = 1
    #: an image is one sample: throughput is samples/s (``samples_per_s``), not tokens/s
    unit = "samples"

    def prepare(self) -> None:
        pass

    def check_vocab(self, vocab_size: int) -> None:
        pass

    def check_validation(self, *, eval_every: int, eval_batches: int) -> str | None:
        return None

    def val_batch(self, index: int):
        """Held-out batches: drawn from seeds no training step uses (three numbers, not two)."""
        return self._batch(np.random.default_rng([self.seed, 1, index]))

    def global_batch(self, step: int):
        return self._batch(np.random.default_rng([self.seed, step]))

    def _batch(self, rng: np.random.Generator):
        import torch

        labels = rng.integers(0, self.num_classes, size=self.global_batch_size)
        noise = rng.standard_normal((self.global_batch_size, *self.prototypes.shape[1:])).astype(np.float32)
        images = self.prototypes[labels] + self.noise * noise
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
