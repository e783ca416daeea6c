"""``data=preference``: pairs of completions, one preferred, in TRL's standard forms, rendered with the model folder's
chat template; only the completions' tokens are scored.

Each line of ``data.path`` (a ``.jsonl`` file, or a folder of them) is one of:

- ``{"prompt": "...", "chosen": "...", "rejected": "..."}``: strings, rendered as a user turn and an assistant reply;
- ``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}``: conversational (TRL's form);
- ``{"chosen": ..., "rejected": ...}``: the prompt implicit, the longest common prefix of the two (of characters,
  or of messages), as TRL's ``extract_prompt`` takes it.

A pair becomes two sequences, prompt + chosen and prompt + rejected: the prompt is the template's rendering of the
prompt with the generation prompt, the completion what the rendering of the whole adds after it (tokens, as TRL
splits them: the common prefix of the two tokenizations). ``data.max_prompt_len`` keeps the prompt's last tokens
(null: the whole prompt); a pair longer than ``data.seq_len + 1`` tokens after that, a missing field, an empty
completion or a line that is not JSON is refused with its file and line, before any worker starts.

Prepared once (``prepare()``, in the launcher) into a folder like ``data=chat``'s: per split the sequences' tokens,
their target flags (the completion) and offsets, sequence ``2k`` the chosen and ``2k + 1`` the rejected of pair
``k``; a seeded draw of ``data.val_fraction`` of the pairs is the validation split. The reference model's
log-probabilities (``trainer/loop/reference.py``) are stored beside them, one file per model.

Batches: ``data.global_batch_size`` sequences (two per pair), rows ``[chosen, rejected, chosen, rejected, ...]``
drawn from a seeded order of the pairs, one epoch after another; the targets carry one more column, the row's
reference log-probability (``models/preference.py``). Any even split of the rows keeps each pair whole.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data.chat import (
    ROLES,
    SPLITS,
    fingerprint,
    input_files,
    load_tokenizer,
    read_documents,
    refuse_problems,
    write_prepared,
)
from trainer.data.packing import assemble, fill_rows
from trainer.data.shards import DataError
from trainer.data.user_files import NOT_UTF8, read_json_object, text_lines

FORMAT = "meshtrain-preference-shards"
VERSION = 1
METADATA = "metadata.json"
FORMS = ("standard", "conversational", "implicit prompt")


def read_pairs(files: list[Path]) -> tuple[list[tuple[str, list[dict], list[dict], list[dict]]], list[str]]:
    """(``file:line``, prompt, chosen, rejected messages) of every pair, and the problems (each with file:line)."""
    found, problems = [], []
    for path in files:
        for where, line in text_lines(path):
            if line is None:
                problems.append(f"{where}: {NOT_UTF8}")
                continue
            try:
                found.append((where, *parse_pair(line)))
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
    return found, problems


def parse_pair(line: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(prompt, chosen, rejected) messages of one JSON line in any of TRL's forms; ValueError says what is wrong."""
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise ValueError('not a JSON object ({"prompt": ..., "chosen": ..., "rejected": ...})')
    for key in ("chosen", "rejected"):
        if key not in row:
            raise ValueError(f'no "{key}" field (each line has "chosen" and "rejected", and "prompt" or not)')
    prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
    if "prompt" not in row:
        prompt, chosen, rejected = common_prefix(chosen, rejected)
    if all(isinstance(v, str) for v in (prompt, chosen, rejected)):
        for key, text in (("chosen", chosen), ("rejected", rejected)):
            if not text.strip():
                raise ValueError(f"the {key} completion is empty: nothing to compare")
        prompt_messages = [{"role": "user", "content": prompt}] if prompt else []
        return prompt_messages, _reply(chosen), _reply(rejected)
    if all(isinstance(v, list) for v in (prompt, chosen, rejected)):
        return _messages(prompt, "prompt"), _messages(chosen, "chosen"), _messages(rejected, "rejected")
    raise ValueError(
        "prompt, chosen and rejected must be all strings or all message lists (TRL's standard or conversational form)"
    )


def common_prefix(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """The implicit prompt: the longest common prefix of chosen and rejected (characters or messages; a space just
    before the split stays with the completions), and what remains of each."""
    if not (isinstance(chosen, (str, list)) and type(chosen) is type(rejected)):
        raise ValueError("chosen and rejected must both be strings or both message lists")
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if isinstance(chosen, str) and n and chosen[n - 1] == " ":
        n -= 1
    return chosen[:n], chosen[n:], rejected[n:]


def _reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def _messages(messages: list, key: str) -> list[dict]:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"{key} message {i} has no text content")
        if m.get("role") not in ROLES:
            raise ValueError(f"{key} message {i} has the unknown role {m.get('role')!r} (roles: {', '.join(ROLES)})")
    if key != "prompt" and not any(m["content"].strip() for m in messages):
        raise ValueError(f"the {key} completion is empty: nothing to compare")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def tokenize_pair(tok: Any, prompt: list[dict], completions: list[list[dict]]) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, each completion's ids): the rendered prompt with the generation prompt, and what the rendering
    of prompt + completion adds after the ids the two share (TRL's split of a pair)."""

    def ids(messages: list[dict], **kwargs: Any) -> list[int]:
        text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    head = ids(prompt, add_generation_prompt=True) if prompt else []
    wholes = [ids(prompt + c) for c in completions]
    shared = min(_shared(head, w) for w in wholes)
    return head[:shared], [w[shared:] for w in wholes]


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def encode_pair(
    tok: Any, pair: tuple[list[dict], list[dict], list[dict]], *, seq_len: int, max_prompt_len: int | None
) -> list[tuple[list[int], list[bool]]]:
    """The pair's two sequences (ids, completion flags), the prompt cut to its last ``max_prompt_len`` tokens;
    ValueError when a completion renders to nothing or a sequence is longer than ``seq_len + 1``."""
    prompt, chosen, rejected = pair
    head, tails = tokenize_pair(tok, prompt, [chosen, rejected])
    if max_prompt_len is not None and len(head) > max_prompt_len:
        head = head[len(head) - max_prompt_len :] if max_prompt_len > 0 else []
    out = []
    for name, tail in zip(("chosen", "rejected"), tails):
        if not tail:
            raise ValueError(f"the {name} completion renders to no token: nothing to compare")
        n = len(head) + len(tail)
        if n > seq_len + 1:
            raise ValueError(
                f"prompt + {name} is {n} tokens ({len(head)} + {len(tail)}), longer than data.seq_len + 1 = "
                f"{seq_len + 1}; raise data.seq_len, set data.max_prompt_len to cut the prompt, or shorten the pair"
            )
        out.append((head + tail, [False] * len(head) + [True] * len(tail)))
    return out


def prepare_pairs(
    *,
    files: list[Path],
    tokenizer: Path,
    output: Path,
    seq_len: int,
    max_prompt_len: int | None,
    val_fraction: float,
    seed: int,
    stamp: str,
) -> dict[str, Any]:
    """Tokenize every pair, refuse bad ones (all listed, by file and line), write the splits and ``metadata.json``
    last; returns the metadata."""
    pairs, problems = read_pairs(files)
    tok = load_tokenizer(tokenizer)
    encoded = []
    for where, *pair in pairs:
        try:
            encoded.append(encode_pair(tok, tuple(pair), seq_len=seq_len, max_prompt_len=max_prompt_len))
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    refuse_problems(problems, source="data=preference", things="pair(s)")
    if not encoded:
        raise DataError(f"data.path: no preference pair in {', '.join(map(str, files))}")
    return write_prepared(
        output,
        [list(pair) for pair in encoded],
        unit="pairs",
        kind="folder",
        header={"format": FORMAT, "version": VERSION, "fingerprint": stamp},
        tok=tok,
        tokenizer=tokenizer,
        files=files,
        seq_len=seq_len,
        seed=seed,
        val_fraction=val_fraction,
    )


class PreferenceData:
    """Batches of pairs (``data=preference``): ``global_batch(step)`` and ``val_batch(i)`` as the other sources,
    targets with the reference column (``models/preference.py``)."""

    #: what throughput counts (the console's tok/s)
    unit = "tokens"

    def __init__(
        self,
        *,
        global_batch_size: int,
        seq_len: int,
        path: str | None = None,
        tokenizer: str | None = None,
        prepared: str | None = None,
        cache_dir: str = "~/.cache/meshtrain/preference",
        val_fraction: float = 0.1,
        max_prompt_len: int | None = None,
        micro_batch_size: int | None = None,
        seed: int = 0,
        name: str = "preference",
    ):
        if not path:
            raise DataError("data=preference needs data.path=<a .jsonl of preference pairs, or a folder of them>")
        if not tokenizer:
            raise DataError(
                "data=preference needs a tokenizer with a chat template: start from a model folder "
                "(model.init_from=DIR) or set data.tokenizer=DIR"
            )
        if global_batch_size % 2:
            raise DataError(
                f"data.global_batch_size={global_batch_size}: data=preference counts sequences, two per pair; "
                "use an even number"
            )
        self.global_batch_size = global_batch_size
        self.seq_len = seq_len
        self.path = Path(path).expanduser()
        self.tokenizer = Path(tokenizer).expanduser()
        self.prepared = Path(prepared).expanduser() if prepared else None
        self.cache_dir = Path(cache_dir).expanduser()
        self.val_fraction = val_fraction
        self.max_prompt_len = None if max_prompt_len is None else int(max_prompt_len)
        self.seed = seed
        self.reference: dict[str, np.ndarray] = {}
        """Each split's reference log-probability per sequence (``set_reference``); NaN until set."""
        self._orders: dict[int, np.ndarray] = {}

    tokens_per_sample = property(lambda self: self.seq_len)

    @cached_property
    def _stamp(self) -> str:
        settings = {
            "seq_len": self.seq_len,
            "max_prompt_len": self.max_prompt_len,
            "val_fraction": self.val_fraction,
            "seed": self.seed,
            "format": FORMAT,
            "v": VERSION,
        }
        return fingerprint(input_files(self.path), self.tokenizer, settings)

    @property
    def folder(self) -> Path:
        return self.prepared if self.prepared is not None else self.cache_dir / self._stamp[:16]

    def prepare(self) -> None:
        """Tokenize into ``folder`` unless it already holds these inputs prepared (launcher, before spawn)."""
        path = self.folder / METADATA
        if path.is_file() and read_json_object(path, error=DataError).get("fingerprint") == self._stamp:
            return
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        prepare_pairs(
            files=input_files(self.path),
            tokenizer=self.tokenizer,
            output=self.folder,
            seq_len=self.seq_len,
            max_prompt_len=self.max_prompt_len,
            val_fraction=self.val_fraction,
            seed=self.seed,
            stamp=self._stamp,
        )
        self.__dict__.pop("metadata", None)

    @cached_property
    def metadata(self) -> dict[str, Any]:
        path = self.folder / METADATA
        meta = read_json_object(path, error=DataError) if path.is_file() else {}
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise DataError(f"{path}: not a prepared {FORMAT} v{VERSION} folder; prepare() first, or remove it")
        return meta

    @cached_property
    def _splits(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return {split: read_documents(self.folder, split, dtype=self.metadata["dtype"]) for split in SPLITS}

    def pairs(self, split: str) -> int:
        return (len(self._splits[split][2]) - 1) // 2

    def sequences(self, split: str) -> int:
        return len(self._splits[split][2]) - 1

    def set_reference(self, split: str, logps: np.ndarray) -> None:
        """The reference log-probability of each sequence of ``split`` (the reference pass, or its file)."""
        if len(logps) != self.sequences(split):
            raise DataError(f"{self.folder}: {len(logps)} reference values for {self.sequences(split)} sequences")
        self.reference[split] = np.asarray(logps, dtype=np.float64)

    def reference_file(self, key: str) -> Path:
        """Where the reference log-probabilities of the model named by ``key`` are kept, beside the shards."""
        return self.folder / f"reference_{key[:16]}.npz"

    def _batch(self, split: str, sequences: list[int], column: np.ndarray):
        import torch

        tokens, flags, offsets = self._splits[split]

        def document(d: int) -> tuple[np.ndarray, np.ndarray]:
            a, b = int(offsets[d]), int(offsets[d + 1])
            return tokens[a:b].astype(np.int64), flags[a:b]

        rows = fill_rows(np.diff(offsets) - 1, sequences, seq_len=self.seq_len, packing="none")
        pad = int(self.metadata["tokenizer"]["pad_id"])
        x, y = assemble(rows, document, seq_len=self.seq_len, pad_id=pad, packed=False)
        y = np.concatenate([y, np.asarray(column, dtype=np.int64).reshape(-1, 1)], axis=1)
        return torch.from_numpy(x), torch.from_numpy(y)

    def _rows_of_pairs(self, split: str, pairs: list[int]):
        sequences = [s for p in pairs for s in (2 * p, 2 * p + 1)]
        ref = self.reference.get(split)
        values = ref[sequences] if ref is not None else np.full(len(sequences), np.nan)
        return self._batch(split, sequences, np.ascontiguousarray(values, dtype=np.float64).view(np.int64))

    def _train_pair(self, index: int) -> int:
        n = self.pairs("train")
        epoch, within = divmod(index, n)
        if epoch not in self._orders:
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(n)
        return int(self._orders[epoch][within])

    def global_batch(self, step: int):
        """(inputs, targets) for ``step``: ``(global_batch_size, seq_len)`` inputs, targets with one more column;
        identical on every rank."""
        per = self.global_batch_size // 2
        return self._rows_of_pairs("train", [self._train_pair(step * per + i) for i in range(per)])

    def val_batch(self, index: int):
        """The ``index``-th validation batch: the held-out pairs in order, wrapping around."""
        n = self.pairs("validation")
        if n == 0:
            raise DataError(f"{self.folder}: no validation pair to evaluate on")
        per = self.global_batch_size // 2
        return self._rows_of_pairs("validation", [(index * per + i) % n for i in range(per)])

    def reference_batches(self, split: str):
        """Every sequence of ``split`` once, in batches of ``global_batch_size`` rows (the last one filled by
        wrapping around), the column holding each row's sequence index: the reference pass's input."""
        n, b = self.sequences(split), self.global_batch_size
        for start in range(0, n, b):
            sequences = [(start + i) % n for i in range(b)]
            yield self._batch(split, sequences, np.array(sequences, dtype=np.int64))

    def check_vocab(self, vocab_size: int) -> None:
        vocab = int(self.metadata["tokenizer"]["vocab_size"])
        if vocab > vocab_size:
            raise DataError(
                f"data.tokenizer={self.tokenizer} has {vocab} tokens but model.vocab_size={vocab_size}; "
                "use the model folder's own tokenizer"
            )

    def check_validation(self, *, eval_every: int, eval_batches: int) -> str | None:
        if eval_every > 0 and self.pairs("validation") == 0:
            raise DataError(
                f"data=preference: the validation split of {self.path} is empty but trainer.eval_every={eval_every}; "
                "raise data.val_fraction or set trainer.eval_every=0"
            )
        return None
