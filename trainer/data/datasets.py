"""Data sources whose global batch for step k depends only on (seed, step).

That makes every layout see the same samples at the same step, so losses are comparable across
strategies, and resuming needs no loader state beyond the step number. Each rank draws the global
batch's indices (cheap) and keeps its own shard; the token file is memory-mapped, so ranks share pages.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np


class DataError(ValueError):
    """A data file is missing, unreadable or inconsistent with the model; the message names it."""


def _stdlib_sources(max_bytes: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class TextCorpus:
    """Byte-level (or pre-tokenised) text; samples are random windows of ``seq_len + 1`` tokens."""

    def __init__(
        self,
        *,
        global_batch_size: int,
        seq_len: int,
        path: str | None = None,
        cache_dir: str = "~/.cache/meshtrain",
        max_bytes: int = 4_000_000,
        micro_batch_size: int | None = None,
        seed: int = 0,
        name: str = "text",
    ):
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.path = Path(os.path.expanduser(path)) if path else None
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.max_bytes = max_bytes
        self._tokens: np.ndarray | None = None

    @property
    def tokens_per_sample(self) -> int:
        return self.seq_len

    @property
    def source(self) -> Path:
        if self.path is not None:
            return self.path
        ver = f"{sys.version_info.major}.{sys.version_info.minor}"
        return self.cache_dir / f"stdlib-py{ver}-{self.max_bytes}.u8"

    def prepare(self) -> None:
        """Build the stdlib token cache once (launcher process, before workers start)."""
        if self.path is None and not self.source.exists():
            _atomic_write(self.source, _stdlib_sources(self.max_bytes))

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

    def global_batch(self, step: int):
        """(inputs, targets) of shape (global_batch_size, seq_len) for ``step``, identical on every rank."""
        import torch

        tokens = self.tokens
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(tokens) - self.seq_len - 1, size=self.global_batch_size)
        window = np.asarray(tokens[starts[:, None] + np.arange(self.seq_len + 1)], dtype=np.int64)
        t = torch.from_numpy(window)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


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

    def prepare(self) -> None:
        pass

    def check_vocab(self, vocab_size: int) -> None:
        pass

    def global_batch(self, step: int):
        import torch

        rng = np.random.default_rng([self.seed, step])
        labels = rng.integers(0, self.num_classes, size=self.global_batch_size)
        noise = rng.standard_normal((self.global_batch_size, *self.prototypes.shape[1:])).astype(np.float32)
        images = self.prototypes[labels] + self.noise * noise
        return torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
