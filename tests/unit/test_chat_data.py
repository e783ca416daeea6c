"""data=chat in one process (trainer/data/chat.py): conversations rendered by the folder's own chat template, only
assistant tokens as targets, prepared once, rows padded or packed; bad input refused with file and line."""

from __future__ import annotations

import pytest
import torch

from models.losses import IGNORE_INDEX
from tests.chat_helpers import conversations, write_jsonl, write_tokenizer
from trainer.data.chat import ChatData, tokenize
from trainer.data.shards import DataError

SEQ = 128


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok"))


def _data(tmp_path, tokenizer_dir, rows, **kw):
    path = write_jsonl(tmp_path / "chats.jsonl", rows)
    kw = {"global_batch_size": 4, "seq_len": SEQ, "path": str(path), "tokenizer": str(tokenizer_dir), **kw}
    return ChatData(cache_dir=str(tmp_path / "cache"), **kw)


def test_only_assistant_replies_are_targets_and_ids_are_the_templates(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    for conv in conversations(6):
        messages = conv["messages"]
        ids, flags = tokenize(tok, messages)
        assert ids == tok.apply_chat_template(messages, tokenize=True, return_dict=False)
        replies = "".join(m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant")
        assert tok.decode([i for i, f in zip(ids, flags) if f]) == replies


def test_batches_mask_prompts_and_padding_and_packing_keeps_the_targets(tmp_path, tokenizer_dir):
    rows = conversations(20)
    plain = _data(tmp_path, tokenizer_dir, rows, val_fraction=0.2)
    plain.prepare()
    meta = plain.metadata
    assert meta["splits"]["validation"]["conversations"] == 4 and meta["splits"]["train"]["conversations"] == 16
    x, y = plain.global_batch(1)
    assert x.shape == y.shape == (4, SEQ) and x.dtype == y.dtype == torch.int64
    pad = meta["tokenizer"]["pad_id"]
    assert bool((y[x == pad] == IGNORE_INDEX).all())  # padding is never a target
    assert 0 < int((y != IGNORE_INDEX).sum()) < int((x != pad).sum())  # prompts masked
    # packed: the same conversations in fewer rows, the same targets, positions restarting at each
    packed = _data(tmp_path, tokenizer_dir, rows, val_fraction=0.2, packing="documents")
    packed.prepare()
    assert packed.folder == plain.folder  # packing is a batching choice: one preparation serves both
    one_epoch = packed._rows("train", range(16))
    assert len(one_epoch) < 16 and sorted(d for r in one_epoch for d in r) == list(range(16))
    px, py = packed._batch("train", one_epoch)
    ux, uy = plain._batch("train", [[d] for d in range(16)])
    assert px.shape == (len(one_epoch), 2, SEQ)
    assert sorted(py[py != IGNORE_INDEX].tolist()) == sorted(uy[uy != IGNORE_INDEX].tolist())
    starts = int((px[:, 1] == 0).sum())
    assert starts >= 16  # every conversation starts at position 0 (and each row's padding too)
    vx, vy = packed.val_batch(0)
    assert vx.shape == (4, 2, SEQ)


def test_a_second_prepare_reads_the_folder_and_a_changed_input_prepares_again(tmp_path, tokenizer_dir):
    data = _data(tmp_path, tokenizer_dir, conversations(8))
    data.prepare()
    marker = data.folder / "metadata.json"
    first = marker.stat().st_mtime_ns
    again = _data(tmp_path, tokenizer_dir, conversations(8))
    again.prepare()
    assert again.folder == data.folder and marker.stat().st_mtime_ns == first
    changed = _data(tmp_path, tokenizer_dir, conversations(9))
    changed.prepare()
    assert changed.folder != data.folder and changed.metadata["splits"]["train"]["conversations"] > 0


def test_bad_conversations_are_refused_with_file_and_line(tmp_path, tokenizer_dir):
    good = conversations(3)
    rows = [
        good[0],
        "{not json",
        {"messages": [{"role": "user", "content": "hi"}]},
        {"messages": [{"role": "robot", "content": "beep"}, {"role": "assistant", "content": "ok"}]},
        {
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                good[1]["messages"][-2],
            ]
        },
        {"messages": [{"role": "user", "content": "long " * 80}, {"role": "assistant", "content": "ok"}]},
        {"text": "no messages"},
        good[2],
    ]
    data = _data(tmp_path, tokenizer_dir, rows)
    with pytest.raises(DataError) as caught:
        data.prepare()
    message = str(caught.value)
    path = tmp_path / "chats.jsonl"
    assert "6 conversation(s) refused" in message
    for line, what in [
        (2, "not JSON"),
        (3, "no assistant reply"),
        (4, "unknown role 'robot'"),
        (5, "the last turn (user) has no assistant reply"),
        (6, f"longer than data.seq_len + 1 = {SEQ + 1}"),
        (7, 'no "messages" list'),
    ]:
        assert f"{path}:{line}: " in message and what in message, (line, what, message)
    assert f"{path}:1:" not in message and f"{path}:8:" not in message


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path):
    folder = write_tokenizer(tmp_path / "plain", template=None)
    data = _data(tmp_path, folder, conversations(2))
    with pytest.raises(DataError, match=r"has no chat template.*start from a folder that has one"):
        data.prepare()


def test_chat_needs_a_path_and_a_tokenizer():
    with pytest.raises(DataError, match=r"data=chat needs data.path"):
        ChatData(global_batch_size=2, seq_len=8, tokenizer="x")
    with pytest.raises(DataError, match=r"model.init_from=DIR.*data.tokenizer=DIR"):
        ChatData(global_batch_size=2, seq_len=8, path="x.jsonl")


def test_chat_preparation_says_its_start_stages_and_end(tmp_path, tokenizer_dir, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    data = _data(tmp_path, tokenizer_dir, conversations(12), val_fraction=0.25)
    data.prepare()
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith("preparing chat data from ")]
    assert out[0].endswith(": started") and str(tmp_path / "chats.jsonl") in out[0]
    assert "12 conversation(s) read; loading the tokenizer of" in out[1]
    assert ": tokenizing with its chat template, " in out[2]
    meta = data.metadata["splits"]
    tokens = meta["train"]["tokens"] + meta["validation"]["tokens"]
    assert f": done, 12 conversations, {tokens:,} tokens (" in out[-1] and out[-1].endswith(" s")
    data.prepare()  # prepared already: nothing to say
    assert "preparing chat data" not in capsys.readouterr().out
