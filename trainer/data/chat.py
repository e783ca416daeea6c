"""``data=chat``: conversations in JSON lines, tokenized with the model folder's own chat template, assistant
tokens the only targets.

Each line of ``data.path`` (a ``.jsonl`` file, or a folder of them) is ``{"messages": [{"role": ..., "content":
...}, ...]}`` as the OpenAI and Hugging Face chat formats have it. The tokenizer is the one of ``data.tokenizer``
(by default ``model.init_from``): ``tokenizer.apply_chat_template`` renders each conversation, and the tokens that
render an assistant reply (its text and its end-of-turn marker) are targets; system and user tokens, and the
template's assistant header, are masked out of the loss (``IGNORE_INDEX``).

Prepared once, before any worker starts (``prepare()``, in the launcher), into a folder like ``data=tokens``'s:
``metadata.json`` last, then per split the tokens (``<split>_tokens.bin``), the target flags
(``<split>_targets.bin``) and the document offsets (``<split>_offsets.npy``). A fingerprint of the inputs, the
tokenizer files and the settings names the folder (``data.prepared``, or under ``data.cache_dir``), so a second
run reads it without importing transformers. Bad input (no chat template, an unknown role, a conversation
without an assistant reply or longer than ``data.seq_len + 1`` tokens, a line that is not JSON) is refused with
the file and line, before spawn.

Batches: one conversation per row, padded (``data.packing=none``), or conversations packed into rows
(``data.packing=documents``; ``trainer/data/packing.py``), the rows drawn from a seeded order of the
conversations, one epoch after another, so step k's batch depends only on (seed, step).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.packing import PACKINGS, assemble, fill_rows
from trainer.data.shards import DataError
from trainer.data.user_files import COPY_AGAIN, NOT_UTF8, read_json_object, text_lines
from trainer.observe.startup import Steps

FORMAT = "meshtrain-chat-shards"
VERSION = 1
METADATA = "metadata.json"
SPLITS = ("train", "validation")
ROLES = ("system", "user", "assistant")
#: how many bad lines one refusal lists before it only counts the rest
SHOWN_PROBLEMS = 10
#: files of a tokenizer folder that decide how a conversation is tokenized (part of the fingerprint)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
#: the conversation a tokenizer's chat template must render before any file is prepared with it
SAMPLE = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def input_files(path: Path) -> list[Path]:
    """The ``.jsonl`` files ``data.path`` names: itself, or those under a folder, sorted."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
        if not files:
            raise DataError(f"data.path={path}: no .jsonl files in this folder; data=chat reads JSON lines")
        return files
    if not path.is_file():
        raise DataError(f"data.path={path}: no such file or folder; point it at a .jsonl of conversations")
    return [path]


def read_conversations(files: list[Path]) -> tuple[list[tuple[str, list[dict]]], list[str]]:
    """(``file:line``, messages) of every conversation, and the problems found (each naming its file and line)."""
    found, problems = [], []
    for path in files:
        for where, line in text_lines(path):
            if line is None:
                problems.append(f"{where}: {NOT_UTF8}")
                continue
            problem, messages = _conversation(line)
            if problem:
                problems.append(f"{where}: {problem}")
            else:
                found.append((where, messages))
    return found, problems


def _conversation(line: str) -> tuple[str | None, list[dict]]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        return f"not JSON ({exc})", []
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages:
        return 'no "messages" list (each line is {"messages": [{"role": ..., "content": ...}, ...]})', []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            return f"message {i} has no text content", []
        if m.get("role") not in ROLES:
            return f"message {i} has the unknown role {m.get('role')!r} (roles: {', '.join(ROLES)})", []
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant reply: nothing to train on", []
    if messages[-1]["role"] != "assistant":
        return f"the last turn ({messages[-1]['role']}) has no assistant reply", []
    return None, [{"role": m["role"], "content": m["content"]} for m in messages]


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer (transformers' ``AutoTokenizer``, local files only); refused without a template."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    for name in TOKENIZER_FILES:  # a damaged JSON file named by itself, not by transformers' message
        if name.endswith(".json") and (folder / name).is_file():
            read_json_object(folder / name, error=DataError)
    present = ", ".join(n for n in TOKENIZER_FILES if (folder / n).is_file()) or "none of its files"
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions; any loader error names the folder
        raise DataError(
            f"data.tokenizer={folder}: no tokenizer transformers can load from its {present} "
            f"({type(exc).__name__}: {exc}); {COPY_AGAIN}"
        ) from None
    if not getattr(tok, "chat_template", None):
        raise DataError(
            f"data.tokenizer={folder}: its tokenizer has no chat template (tokenizer_config.json 'chat_template' or "
            "chat_template.jinja); data=chat renders conversations with the model's own template: start from a "
            "folder that has one, or add it there"
        )
    try:
        tok.apply_chat_template(SAMPLE, tokenize=False)
    except Exception as exc:  # noqa: BLE001 - jinja2's TemplateError and what the template raises itself
        raise DataError(
            f"data.tokenizer={folder}: its chat template (chat_template.jinja, or tokenizer_config.json's "
            f"'chat_template') does not render a user turn and a reply ({type(exc).__name__}: {exc}); fix the "
            "template, or copy the folder again"
        ) from None
    return tok


def tokenize(tok: Any, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """(token ids, target flags) of one conversation rendered by the chat template: a token is a target when its
    text lies in an assistant reply, the text each assistant turn adds to the rendering of the turns before it
    followed by the template's generation prompt. Raises ValueError when the template does not render a
    conversation's beginning as a prefix of the whole (then the replies cannot be located)."""
    text = tok.apply_chat_template(messages, tokenize=False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True) if k else ""
        upto = tok.apply_chat_template(messages[: k + 1], tokenize=False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise ValueError(
                "the chat template does not render the conversation's first turns as the beginning of the whole, "
                f"so assistant turn {k} cannot be located"
            )
        spans.append((len(before), len(upto)))
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    flags = [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), flags


def fingerprint(files: list[Path], tokenizer: Path, settings: dict[str, Any]) -> str:
    """sha256 over the input files, the tokenizer's files and the settings that change the shards."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in [*files, *(tokenizer / name for name in TOKENIZER_FILES)]:
        if path.is_file():
            h.update(str(path.name).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def prepare_chat(
    *, files: list[Path], tokenizer: Path, output: Path, seq_len: int, val_fraction: float, seed: int, stamp: str
) -> dict[str, Any]:
    """Tokenize every conversation, refuse bad ones (all listed, by file and line), write the splits and
    ``metadata.json`` last; returns the metadata."""
    where = f"{files[0]}" + (f" and {len(files) - 1} more file(s)" if len(files) > 1 else "")
    steps = Steps(f"preparing chat data from {where}", unit="conversations")
    conversations, problems = read_conversations(files)
    steps.total = len(conversations)
    steps.note(f"{len(conversations):,} conversation(s) read; loading the tokenizer of {tokenizer}")
    tok = load_tokenizer(tokenizer)
    steps.note("tokenizing with its chat template")
    docs: list[tuple[list[int], list[bool]]] = []
    for where, messages in conversations:
        steps.advance()
        try:
            ids, flags = tokenize(tok, messages)
        except Exception as exc:  # noqa: BLE001 - the template's own errors (raise_exception) name the conversation
            problems.append(
                f"{where}: {exc}" if isinstance(exc, ValueError) else f"{where}: the chat template fails ({exc})"
            )
            continue
        if len(ids) > seq_len + 1:
            problems.append(
                f"{where}: {len(ids)} tokens, longer than data.seq_len + 1 = {seq_len + 1} (a row holds "
                "data.seq_len next-token pairs); raise data.seq_len or shorten the conversation"
            )
        elif not any(flags[1:]):
            problems.append(f"{where}: no assistant token after the first: nothing to train on")
        else:
            docs.append((ids, flags))
    refuse_problems(problems, source="data=chat", things="conversation(s)")
    if not docs:
        raise DataError(f"data.path: no conversation in {', '.join(map(str, files))}")
    meta = write_prepared(
        output,
        [[doc] for doc in docs],
        unit="conversations",
        kind="chat folder",
        header={"format": FORMAT, "version": VERSION, "fingerprint": stamp},
        tok=tok,
        tokenizer=tokenizer,
        files=files,
        seq_len=seq_len,
        seed=seed,
        val_fraction=val_fraction,
    )
    splits = meta["splits"]
    tokens = sum(split["tokens"] for split in splits.values())
    targets = sum(split["targets"] for split in splits.values())
    steps.end(f"{len(docs):,} conversations, {tokens:,} tokens ({targets:,} targets) in {output}")
    return meta


def write_prepared(
    output: Path,
    items: list[list[tuple[list[int], list[bool]]]],
    *,
    unit: str,
    kind: str,
    header: dict[str, Any],
    tok,
    tokenizer: Path,
    files: list[Path],
    seq_len: int,
    seed: int,
    val_fraction: float,
) -> dict[str, Any]:
    """Hold out ``val_fraction`` of ``items`` (a conversation, or a pair's two sequences, each: documents that stay in
    one split) by ``seed``, write each split's documents and ``metadata.json`` last, into a temporary folder renamed
    to ``output`` (a crash leaves no half-written prepared folder); returns the metadata."""
    n_val = int(round(len(items) * val_fraction)) if len(items) > 1 else 0
    val = set(np.random.default_rng(seed).permutation(len(items))[:n_val].tolist())
    if output.is_dir() and any(output.iterdir()) and not (output / METADATA).is_file():
        raise DataError(f"data.prepared={output} exists and is not a prepared {kind}; name a new or empty one")
    tmp = output.with_name(f"{output.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dtype = "uint16" if len(tok) <= 2**16 else "uint32"
    splits = {}
    for split in SPLITS:
        held = [i for i in range(len(items)) if (i in val) == (split == "validation")]
        documents = [doc for i in held for doc in items[i]]
        splits[split] = {unit: len(held), **write_documents(tmp, split, documents, dtype=dtype)}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    meta = {
        **header,
        "dtype": dtype,
        "tokenizer": {"source": str(tokenizer), "vocab_size": len(tok), "pad_id": int(pad or 0)},
        "inputs": [str(p) for p in files],
        "seq_len": seq_len,
        "splits": splits,
    }
    (tmp / METADATA).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(output, ignore_errors=True)
    tmp.rename(output)
    return meta


def write_documents(folder: Path, split: str, docs: list[tuple[list[int], list[bool]]], *, dtype: str) -> dict:
    """One split's documents (token ids, target flags) as ``<split>_tokens.bin``, ``<split>_targets.bin`` and
    ``<split>_offsets.npy`` in ``folder``; returns its token and target counts."""
    tokens = np.array([t for ids, _ in docs for t in ids], dtype=dtype)
    flags = np.array([f for _, fl in docs for f in fl], dtype=np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(ids) for ids, _ in docs], dtype=np.int64)])
    tokens.tofile(folder / f"{split}_tokens.bin")
    flags.tofile(folder / f"{split}_targets.bin")
    np.save(folder / f"{split}_offsets.npy", offsets)
    return {"tokens": int(len(tokens)), "targets": int(flags.sum())}


def read_documents(folder: Path, split: str, *, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, target flags, offsets) of a split ``write_documents`` wrote."""
    tokens = np.fromfile(folder / f"{split}_tokens.bin", dtype=dtype)
    flags = np.fromfile(folder / f"{split}_targets.bin", dtype=np.uint8).astype(bool)
    return tokens, flags, np.load(folder / f"{split}_offsets.npy")


def refuse_problems(problems: list[str], *, source: str, things: str) -> None:
    """Raise ``DataError`` listing the first ``SHOWN_PROBLEMS`` of ``problems`` (each naming its file and line)."""
    if not problems:
        return
    more = len(problems) - SHOWN_PROBLEMS
    listed = "\n  ".join(problems[:SHOWN_PROBLEMS]) + (f"\n  ... and {more} more" if more > 0 else "")
    raise DataError(f"{source}: {len(problems)} {things} refused:\n  {listed}")


class ChatData:
    """Rows of whole conversations (``data=chat``); ``global_batch(step)`` and ``val_batch(i)`` as the other data
    sources, targets ``IGNORE_INDEX`` outside assistant replies."""

    def __init__(
        self,
        *,
        global_batch_size: int,
        seq_len: int,
        path: str | None = None,
        tokenizer: str | None = None,
        prepared: str | None = None,
        cache_dir: str = "~/.cache/meshtrain/chat",
        val_fraction: float = 0.1,
        packing: str = "none",
        micro_batch_size: int | None = None,
        seed: int = 0,
        name: str = "chat",
    ):
        if packing not in PACKINGS:
            raise DataError(f"data.packing={packing}: use one of {', '.join(PACKINGS)}")
        if not path:
            raise DataError("data=chat needs data.path=<a .jsonl of conversations, or a folder of them>")
        if not tokenizer:
            raise DataError(
                "data=chat needs a tokenizer with a chat template: start from a model folder (model.init_from=DIR) "
                "or set data.tokenizer=DIR"
            )
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.path = Path(path).expanduser()
        self.tokenizer = Path(tokenizer).expanduser()
        self.prepared = Path(prepared).expanduser() if prepared else None
        self.cache_dir = Path(cache_dir).expanduser()
        self.val_fraction = val_fraction
        self.packing = packing
        self.seed = seed
        self._epochs: list[list[list[int]]] = []

    tokens_per_sample = property(lambda self: self.seq_len)

    @cached_property
    def _stamp(self) -> str:
        files = input_files(self.path)
        settings = {"seq_len": self.seq_len, "val_fraction": self.val_fraction, "seed": self.seed, "v": VERSION}
        return fingerprint(files, self.tokenizer, settings)

    @property
    def folder(self) -> Path:
        return self.prepared if self.prepared is not None else self.cache_dir / self._stamp[:16]

    def prepare(self) -> None:
        """Tokenize into ``folder`` unless it already holds these inputs prepared (launcher, before spawn)."""
        meta = self._metadata(required=False)
        if meta is not None and meta.get("fingerprint") == self._stamp:
            return
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        prepare_chat(
            files=input_files(self.path),
            tokenizer=self.tokenizer,
            output=self.folder,
            seq_len=self.seq_len,
            val_fraction=self.val_fraction,
            seed=self.seed,
            stamp=self._stamp,
        )
        self.__dict__.pop("metadata", None)

    def _metadata(self, *, required: bool = True) -> dict[str, Any] | None:
        path = self.folder / METADATA
        if not path.is_file():
            if required:
                raise DataError(f"{self.folder}: no {METADATA}; the chat data was not prepared (prepare() first)")
            return None
        meta = read_json_object(path, error=DataError, fix="remove the folder and run again")
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            return None if not required else _refuse(path)
        return meta

    @cached_property
    def metadata(self) -> dict[str, Any]:
        return self._metadata()

    @cached_property
    def _splits(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return {split: read_documents(self.folder, split, dtype=self.metadata["dtype"]) for split in SPLITS}

    def _document(self, split: str):
        tokens, flags, offsets = self._splits[split]

        def document(d: int) -> tuple[np.ndarray, np.ndarray]:
            a, b = int(offsets[d]), int(offsets[d + 1])
            return tokens[a:b].astype(np.int64), flags[a:b]

        return document

    def _rows(self, split: str, order) -> list[list[int]]:
        offsets = self._splits[split][2]
        return fill_rows(np.diff(offsets) - 1, order, seq_len=self.seq_len, packing=self.packing)

    def _batch(self, split: str, rows: list[list[int]]):
        import torch

        x, y = assemble(
            rows,
            self._document(split),
            seq_len=self.seq_len,
            pad_id=int(self.metadata["tokenizer"]["pad_id"]),
            packed=self.packing == "documents",
        )
        return torch.from_numpy(x), torch.from_numpy(y)

    def _train_row(self, index: int) -> list[int]:
        """The ``index``-th training row over the epochs, each epoch a seeded order of every conversation."""
        n = len(self._splits["train"][2]) - 1
        while True:
            seen = 0
            for rows in self._epochs:
                if index < seen + len(rows):
                    return rows[index - seen]
                seen += len(rows)
            order = np.random.default_rng([self.seed, len(self._epochs)]).permutation(n)
            self._epochs.append(self._rows("train", order))

    def global_batch(self, step: int):
        """(inputs, targets) for ``step``: ``(global_batch_size, seq_len)`` or, packed, ``(global_batch_size, 2,
        seq_len)`` inputs; identical on every rank."""
        b = self.global_batch_size
        return self._batch("train", [self._train_row(step * b + i) for i in range(b)])

    def val_rows(self) -> list[list[int]]:
        n = len(self._splits["validation"][2]) - 1
        return self._rows("validation", range(n))

    def val_batch(self, index: int):
        """The ``index``-th validation batch: the held-out conversations in order, wrapping around."""
        rows = self.val_rows()
        if not rows:
            raise DataError(f"{self.folder}: no validation conversation to evaluate on")
        b = self.global_batch_size
        return self._batch("validation", [rows[(index * b + i) % len(rows)] for i in range(b)])

    def check_vocab(self, vocab_size: int) -> None:
        vocab = int(self.metadata["tokenizer"]["vocab_size"])
        if vocab > vocab_size:
            raise DataError(
                f"data.tokenizer={self.tokenizer} has {vocab} tokens but model.vocab_size={vocab_size}; "
                "use the model folder's own tokenizer"
            )

    def check_validation(self, *, eval_every: int, eval_batches: int) -> str | None:
        if eval_every <= 0:
            return None
        if not self.val_rows():
            raise DataError(
                f"data=chat: the validation split of {self.path} is empty but trainer.eval_every={eval_every}; "
                "raise data.val_fraction or set trainer.eval_every=0"
            )
        return None


def _refuse(path: Path) -> dict[str, Any]:
    raise DataError(f"{path} is not a {FORMAT} v{VERSION} metadata file; remove the folder and run again")
