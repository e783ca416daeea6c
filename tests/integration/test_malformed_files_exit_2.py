"""A damaged file of a user's folder, as a user meets it: ``python train.py`` ends with exit code 2, the file named on
stderr and no traceback, before any worker starts (tests/system/test_malformed_user_files.py tries every file kind and
damage in-process; this runs two of them through the real command)."""

from __future__ import annotations

import pytest

from tests.chat_helpers import VOCAB, conversations, write_jsonl, write_tokenizer
from tests.helpers import run_train
from tests.hf_helpers import hf_model, save_folder

#: two train.py runs that import transformers (the chat tokenizer), forked from the warm runner (tests/warm_runner.py:
#: the same train.py, argv, exit code and stderr; torch and Hydra already imported), kept out of the fast tier
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    root = tmp_path_factory.mktemp("start")
    hf = hf_model("qwen3", vocab_size=VOCAB, max_position_embeddings=128, num_key_value_heads=2, head_dim=32)
    return write_tokenizer(save_folder(hf, root / "qwen3")), write_jsonl(root / "chats.jsonl", conversations(8))


def refused(*overrides: str, run_dir) -> str:
    run = run_train(*overrides, "logger=none", run_dir=run_dir, expect_ok=False, timeout=120)
    assert run.proc.returncode == 2 and "Traceback" not in run.output, run.output[-3000:]
    assert not (run_dir / "rank_0.log").exists(), "a worker started"
    return run.proc.stderr


def test_a_cut_config_json_and_a_binary_conversations_file_exit_2_naming_the_file(start, tmp_path):
    folder, chats = start
    config = folder / "config.json"
    whole = config.read_bytes()
    chat = ("data=chat", "data.seq_len=128", "data.global_batch_size=4", f"data.cache_dir={tmp_path / 'cache'}")
    try:
        config.write_bytes(whole[: len(whole) // 2])
        err = refused(f"model.init_from={folder}", *chat, f"data.path={chats}", run_dir=tmp_path / "a")
        assert f"{config}: not valid JSON" in err, err
    finally:
        config.write_bytes(whole)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"messages": [\xff\xfe]}\n')
    err = refused(f"model.init_from={folder}", *chat, f"data.path={binary}", run_dir=tmp_path / "b")
    assert f"{binary}:1: not UTF-8 text" in err, err
