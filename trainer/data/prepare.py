"""Prepare a token dataset from local files: ``python -m trainer.data.prepare --input DIR --output OUT``.

Reads text (``.txt``, ``.md``, ...), JSON lines (``.jsonl``, ``.json``) and Parquet files with HF
``datasets`` from local files only (no hub, no download: the process runs with HF_DATASETS_OFFLINE=1
and HF_HUB_OFFLINE=1), then

1. splits the documents into train and validation (a seeded draw of ``--val-fraction`` of them);
2. trains a byte-level BPE tokenizer of ``--vocab-size`` on the train documents with HF ``tokenizers``
   (or loads ``--tokenizer tokenizer.json``, or a Hugging Face model folder's, whose ``tokenizer_config.json``
   then names the end-of-text token), with an end-of-text token that separates documents;
3. writes each split as memory-mappable shards of uint16 (vocabulary <= 65536) or uint32 tokens,
   every document followed by the EOS id, and ``metadata.json`` last (``trainer/data/shards.py``).

Running it again on the same inputs with the same settings does nothing: a fingerprint of the input
files' contents and the settings is kept in the metadata. An interrupted run leaves no shard that looks
complete: shards are written as ``*.tmp`` and renamed when whole, the old metadata is removed before the
first shard is touched, and the new metadata is written last, so a folder without ``metadata.json`` is
refused by the loader. Then train with ``python train.py data=tokens data.path=OUT model.vocab_size=V``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# HF datasets and hub read these when they are imported: local files only, never the network
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

from trainer.data.shards import (  # noqa: E402
    FORMAT,
    METADATA,
    VERSION,
    DataError,
    check_shards,
    dtype_for_vocab,
    read_metadata,
    sha256_file,
)
from trainer.data.user_files import read_json_object, read_tokenizer  # noqa: E402
from trainer.observe.durable import write_bytes_atomic  # noqa: E402
from trainer.observe.startup import Steps  # noqa: E402

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".py")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")
DEFAULT_EOS = "<|endoftext|>"


class PrepareError(ValueError):
    """Bad input or settings; the message says which and how to fix it."""


def find_inputs(inputs: list[str]) -> list[Path]:
    """Every readable data file named, or found (recursively) under a named folder, sorted."""
    found: list[Path] = []
    suffixes = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
    for name in inputs:
        p = Path(name).expanduser()
        if p.is_dir():
            found += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in suffixes)
        elif p.is_file():
            found.append(p)
        else:
            raise PrepareError(f"--input {name}: no such file or folder")
    if not found:
        raise PrepareError(f"--input {' '.join(inputs)}: no {', '.join(suffixes)} files found")
    return sorted({f.resolve() for f in found})


def _kind(path: Path) -> str:
    s = path.suffix.lower()
    if s in JSON_SUFFIXES:
        return "json"
    if s in PARQUET_SUFFIXES:
        return "parquet"
    return "text"


def fingerprint(files: list[Path], settings: dict[str, Any], tokenizer_file: Path | None) -> str:
    h = hashlib.sha256(
        json.dumps({"format": FORMAT, "version": VERSION, "settings": settings}, sort_keys=True).encode()
    )
    for f in files:
        h.update(f"{f}\0{f.stat().st_size}\0{sha256_file(f)}\0".encode())
    if tokenizer_file is not None:
        h.update(sha256_file(tokenizer_file).encode())
    return h.hexdigest()


def load_documents(files: list[Path], *, text_field: str, sample_by: str, cache_dir: Path):
    """Every non-empty document of every file, in file order: one HF ``Dataset`` with a ``text`` column,
    read from the local files into Arrow files under ``cache_dir`` (memory-mapped, not held in memory). Consecutive
    text files are read by one ``load_dataset`` (10 ms a call: a folder of many small files), JSON and Parquet
    files one by one (each file's own columns checked); a read that fails is retried file by file to name the file."""
    import itertools

    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    parts = []
    for kind, run in itertools.groupby(files, key=_kind):
        group = list(run)
        if kind == "text" and len(group) > 1:
            try:
                parts.append(_read_files(kind, group, text_field=text_field, sample_by=sample_by, cache_dir=cache_dir))
                continue
            except Exception:  # noqa: BLE001 - read again file by file below, to name the file
                pass
        for f in group:
            parts.append(_read(f, kind, text_field=text_field, sample_by=sample_by, cache_dir=cache_dir))
    docs = datasets.concatenate_datasets(parts)
    docs = docs.filter(lambda batch: [isinstance(t, str) and bool(t.strip()) for t in batch["text"]], batched=True)
    if len(docs) == 0:
        raise PrepareError("the input files hold no non-empty documents")
    return docs


def _read(f: Path, kind: str, *, text_field: str, sample_by: str, cache_dir: Path):
    """One file's documents as a ``text`` column; PrepareError naming the file when it cannot be read."""
    try:
        return _read_files(kind, [f], text_field=text_field, sample_by=sample_by, cache_dir=cache_dir)
    except PrepareError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader error names the file
        cause = exc
        while cause.__cause__ is not None:  # datasets wraps the reader's own error ("An error occurred ...")
            cause = cause.__cause__
        why = f"{type(cause).__name__}: {str(cause)[:300]}"
        raise PrepareError(f"{f}: cannot be read as {kind} ({why}); fix or remove the file") from None


def _read_files(kind: str, files: list[Path], *, text_field: str, sample_by: str, cache_dir: Path):
    """``files`` (all of ``kind``) read by one ``load_dataset``, their documents in file order as a ``text`` column."""
    import datasets

    kwargs: dict[str, Any] = {"sample_by": sample_by} if kind == "text" else {}
    data_files = [str(f) for f in files]
    ds = datasets.load_dataset(kind, data_files=data_files, split="train", cache_dir=str(cache_dir), **kwargs)
    column = "text" if kind == "text" else text_field
    if column not in ds.column_names:
        raise PrepareError(f"{files[0]}: no '{text_field}' column (it has {ds.column_names}); set --text-field")
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    return ds.cast(datasets.Features({"text": datasets.Value("string")}))


def iter_texts(docs, *, keep: np.ndarray | None = None, batch: int = 1000) -> Iterator[list[str]]:
    """The documents' texts in batches; with ``keep``, only those whose mask entry is True."""
    for lo in range(0, len(docs), batch):
        texts = docs[lo : lo + batch]["text"]
        yield texts if keep is None else [t for t, k in zip(texts, keep[lo : lo + batch]) if k]


def split_documents(n: int, *, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of validation documents: a seeded draw of round(val_fraction * n), at least one
    when val_fraction > 0 and there are two or more documents."""
    mask = np.zeros(n, dtype=bool)
    if val_fraction <= 0 or n < 2:
        return mask
    k = min(n - 1, max(1, round(val_fraction * n)))
    mask[np.random.default_rng(seed).permutation(n)[:k]] = True
    return mask


def train_bpe(docs: Iterator[str], *, vocab_size: int, count: int, eos: str, show_progress: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=count)
    return tok


def tokenizer_file(tokenizer: str) -> Path:
    """``--tokenizer``: a ``tokenizer.json``, or a Hugging Face model folder holding one (the tokenizer its weights
    were trained with, so a fine-tune from ``model.init_from`` reads the ids it knows)."""
    path = Path(tokenizer).expanduser().resolve()
    if path.is_dir():
        path = path / "tokenizer.json"
        if not path.is_file():
            raise PrepareError(
                f"--tokenizer {tokenizer}: the folder has no tokenizer.json (a fast tokenizer, as save_pretrained "
                "writes it); give a folder with one, or a tokenizer.json"
            )
    if not path.is_file():
        raise PrepareError(f"--tokenizer {tokenizer}: no such file (a HF tokenizers tokenizer.json, or its folder)")
    return path


def hf_eos_token(tok_file: Path) -> str | None:
    """The end-of-text token of the Hugging Face folder holding ``tok_file``: the one its
    ``tokenizer_config.json`` names, else the token of the ``eos_token_id`` its ``config.json`` or
    ``generation_config.json`` gives (a folder that says it only there needs no ``--eos-token``)."""
    config = tok_file.parent / "tokenizer_config.json"
    eos = read_json_object(config, error=PrepareError).get("eos_token") if config.is_file() else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos:
        return eos
    for name in ("config.json", "generation_config.json"):
        path = tok_file.parent / name
        given = read_json_object(path, error=PrepareError).get("eos_token_id") if path.is_file() else None
        given = given[0] if isinstance(given, list) and given else given
        if isinstance(given, int):
            return read_tokenizer(tok_file, error=PrepareError).id_to_token(given)
    return None


def _eos_id(tok, eos: str | None) -> tuple[str, int]:
    names = [eos] if eos else list(EOS_CANDIDATES)
    for name in names:
        i = tok.token_to_id(name)
        if i is not None:
            return name, int(i)
    raise PrepareError(
        f"the tokenizer has no end-of-text token ({', '.join(names)}); name it with --eos-token "
        "(documents are separated by it)"
    )


class ShardWriter:
    """Appends token arrays to ``<split>_NNNNN.bin`` shards of at most ``shard_tokens`` tokens; each
    shard is written to a ``.tmp`` file and renamed only when complete."""

    def __init__(self, folder: Path, split: str, *, dtype: str, shard_tokens: int):
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, np.dtype(dtype), shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.tokens = 0
        self.documents = 0
        self._buf: list[np.ndarray] = []
        self._buffered = 0

    def add(self, ids: np.ndarray) -> None:
        self.documents += 1
        self._buf.append(ids)
        self._buffered += len(ids)
        while self._buffered >= self.shard_tokens:
            flat = np.concatenate(self._buf)
            self._write(flat[: self.shard_tokens])
            rest = flat[self.shard_tokens :]
            self._buf, self._buffered = ([rest] if len(rest) else []), len(rest)

    def close(self) -> None:
        if self._buffered:
            self._write(np.concatenate(self._buf))
        self._buf, self._buffered = [], 0

    def _write(self, tokens: np.ndarray) -> None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        write_bytes_atomic(self.folder / name, tokens.astype(self.dtype).tobytes())
        self.shards.append({"file": name, "tokens": int(len(tokens))})
        self.tokens += int(len(tokens))

    @property
    def tokens_seen(self) -> int:
        """Tokens added so far, written or still buffered."""
        return self.tokens + self._buffered

    def entry(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.shards}


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=False,
    )


def up_to_date(output: Path, fp: str) -> dict[str, Any] | None:
    """The existing metadata when ``output`` already holds this exact preparation, complete."""
    if not (output / METADATA).is_file():
        return None
    try:
        meta = read_metadata(output)
        check_shards(output, meta)
    except DataError:
        return None
    return meta if meta.get("fingerprint") == fp else None


def prepare(
    *,
    inputs: list[str],
    output: str,
    vocab_size: int = 4096,
    tokenizer: str | None = None,
    eos_token: str | None = None,
    text_field: str = "text",
    sample_by: str = "document",
    val_fraction: float = 0.05,
    seed: int = 0,
    shard_tokens: int = 100_000_000,
    batch_docs: int = 1000,
    progress: bool | None = None,
    log=print,
) -> dict[str, Any]:
    """Prepare ``output`` from ``inputs``; returns the metadata (``skipped: True`` when already done)."""
    if sample_by not in ("document", "paragraph", "line"):
        raise PrepareError(f"--sample-by {sample_by}: use document, paragraph or line")
    if not 0 <= val_fraction < 1:
        raise PrepareError(f"--val-fraction {val_fraction}: must be in [0, 1)")
    if shard_tokens < 1:
        raise PrepareError(f"--shard-tokens {shard_tokens}: must be positive")
    tok_file = tokenizer_file(tokenizer) if tokenizer else None
    eos_token = eos_token or (hf_eos_token(tok_file) if tok_file else None)
    if tok_file is None and vocab_size < 257:
        raise PrepareError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 257 (256 bytes + EOS)")
    out = Path(output).expanduser().resolve()
    for name in inputs:
        folder = Path(name).expanduser().resolve()
        if folder.is_dir() and (out == folder or folder in out.parents):
            raise PrepareError(f"--output {out} is inside --input {name}; use a folder outside the inputs")
    files = find_inputs(inputs)
    settings = {
        "vocab_size": None if tok_file else vocab_size,
        "tokenizer": str(tok_file) if tok_file else None,
        "eos_token": eos_token,
        "text_field": text_field,
        "sample_by": sample_by,
        "val_fraction": val_fraction,
        "seed": seed,
        "shard_tokens": shard_tokens,
    }
    fp = fingerprint(files, settings, tok_file)
    existing = up_to_date(out, fp)
    if existing is not None:
        log(f"{out} is up to date (same inputs and settings, fingerprint {fp[:12]}): nothing to do")
        return {**existing, "skipped": True}
    show = sys.stderr.isatty() if progress is None else progress
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    # from here on the folder is being rewritten: no metadata until every shard is complete
    (out / METADATA).unlink(missing_ok=True)
    for stale in list(out.glob("*.bin")) + list(out.glob("*.tmp")):
        stale.unlink()
    for stale in out.glob(".hf-cache-*"):  # left by a killed run
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".hf-cache-") as cache:
        log(f"reading {len(files)} file(s) (HF datasets, local files only)")
        docs = load_documents(files, text_field=text_field, sample_by=sample_by, cache_dir=Path(cache))
        return _tokenize_and_write(
            docs,
            files=files,
            out=out,
            fp=fp,
            settings=settings,
            tok_file=tok_file,
            vocab_size=vocab_size,
            eos_token=eos_token,
            val_fraction=val_fraction,
            seed=seed,
            shard_tokens=shard_tokens,
            batch_docs=batch_docs,
            show=show,
            log=log,
            t0=t0,
        )


def _tokenize_and_write(
    docs,
    *,
    files: list[Path],
    out: Path,
    fp: str,
    settings: dict[str, Any],
    tok_file: Path | None,
    vocab_size: int,
    eos_token: str | None,
    val_fraction: float,
    seed: int,
    shard_tokens: int,
    batch_docs: int,
    show: bool,
    log,
    t0: float,
) -> dict[str, Any]:
    is_val = split_documents(len(docs), val_fraction=val_fraction, seed=seed)
    n_val = int(is_val.sum())
    log(f"{len(files)} files, {len(docs)} documents: {len(docs) - n_val} train, {n_val} validation")

    tok, source = _tokenizer(
        docs, is_val, tok_file=tok_file, vocab_size=vocab_size, eos_token=eos_token, batch_docs=batch_docs,
        show=show, log=log,
    )  # fmt: skip
    eos_name, eos_id = _eos_id(tok, eos_token or (None if tok_file else DEFAULT_EOS))
    tok_path = out / "tokenizer.json"
    write_bytes_atomic(tok_path, tok.to_str().encode())
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    dtype = dtype_for_vocab(vocab)
    writers = {
        split: ShardWriter(out, split, dtype=dtype, shard_tokens=shard_tokens) for split in ("train", "validation")
    }
    _write_shards(docs, is_val, tok=tok, eos_id=eos_id, writers=writers, batch_docs=batch_docs, show=show, log=log)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": fp,
        "dtype": dtype,
        "tokenizer": {
            "file": tok_path.name,
            "sha256": sha256_file(tok_path),
            "vocab_size": vocab,
            "eos_token": eos_name,
            "eos_id": eos_id,
            "source": source,
        },
        "splits": {split: w.entry() for split, w in writers.items()},
        "inputs": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
        "settings": settings,
        "created_unix": time.time(),
    }
    if meta["splits"]["train"]["tokens"] == 0:
        raise PrepareError("no training tokens: every document went to validation; lower --val-fraction")
    write_bytes_atomic(out / METADATA, (json.dumps(meta, indent=2) + "\n").encode())
    s = meta["splits"]
    log(
        f"wrote {out}: vocabulary {vocab} (EOS {eos_name!r} = {eos_id}), {dtype}, "
        f"train {s['train']['tokens']:,} tokens in {len(s['train']['shards'])} shard(s), "
        f"validation {s['validation']['tokens']:,} tokens, {time.perf_counter() - t0:.1f} s"
    )
    log(f"train on it: python train.py data=tokens data.path={out} model.vocab_size={vocab}")
    return meta


def _tokenizer(
    docs, is_val, *, tok_file: Path | None, vocab_size: int, eos_token: str | None, batch_docs: int, show: bool, log
) -> tuple[Any, str]:
    """The given tokenizer file, or a byte-level BPE trained on the train documents; and where it came from."""
    if tok_file is not None:
        return read_tokenizer(tok_file, error=PrepareError), str(tok_file)
    log(f"training a byte-level BPE of {vocab_size} tokens on the train documents")
    train_docs = (t for texts in iter_texts(docs, keep=~is_val, batch=batch_docs) for t in texts)
    n_train = len(docs) - int(is_val.sum())
    trained = time.perf_counter()
    tok = train_bpe(train_docs, vocab_size=vocab_size, count=n_train, eos=eos_token or DEFAULT_EOS, show_progress=show)
    log(f"BPE trained in {time.perf_counter() - trained:.1f} s")
    return tok, "trained byte-level BPE"


def _write_shards(docs, is_val, *, tok, eos_id: int, writers: dict, batch_docs: int, show: bool, log) -> None:
    """Every document tokenized, its EOS appended, into its split's shards (closed at the end); on a terminal
    rich's bar, elsewhere (a file, a pipe) a line at least every PREPARATION_EVERY_S."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    eos_arr = np.array([eos_id], dtype=np.int64)
    steps = None if show else Steps("tokenizing", unit="documents", total=len(docs), say=log)
    with _progress(show) as bar:
        task = bar.add_task("tokenizing", total=len(docs))
        for lo, chunk in zip(range(0, len(docs), batch_docs), iter_texts(docs, batch=batch_docs)):
            for j, enc in enumerate(encode(chunk, add_special_tokens=False)):
                ids = np.concatenate([np.asarray(enc.ids, dtype=np.int64), eos_arr])
                writers["validation" if is_val[lo + j] else "train"].add(ids)
            bar.advance(task, len(chunk))
            if steps is not None:
                steps.advance(len(chunk), note=f"{sum(w.tokens_seen for w in writers.values()):,} tokens")
    if steps is not None:
        steps.end(f"{sum(w.documents for w in writers.values()):,} documents")
    for w in writers.values():
        w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.data.prepare", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--input", "-i", nargs="+", required=True, help="files or folders (.txt/.md, .jsonl/.json, .parquet)"
    )
    p.add_argument("--output", "-o", required=True, help="dataset folder to write (then data.path=...)")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary to train (default 4096)")
    p.add_argument(
        "--tokenizer", help="use this HF tokenizer.json (or a Hugging Face model folder's) instead of training a BPE"
    )
    p.add_argument("--eos-token", help="end-of-text token separating documents (default <|endoftext|>)")
    p.add_argument("--text-field", default="text", help="column holding the text in jsonl/parquet (default text)")
    p.add_argument(
        "--sample-by", default="document", help="a text file's documents: document (whole file), paragraph or line"
    )
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents held out (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/validation draw")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 1e8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        prepare(
            inputs=args.input,
            output=args.output,
            vocab_size=args.vocab_size,
            tokenizer=args.tokenizer,
            eos_token=args.eos_token,
            text_field=args.text_field,
            sample_by=args.sample_by,
            val_fraction=args.val_fraction,
            seed=args.seed,
            shard_tokens=args.shard_tokens,
            progress=False if args.no_progress else None,
        )
    except (PrepareError, DataError) as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
