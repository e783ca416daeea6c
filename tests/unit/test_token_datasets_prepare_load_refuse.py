"""Prepared token datasets, their loader, the prefetcher and the checks before spawn, without workers."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.helpers import write_corpus
from trainer.data.datasets import DataError, TextCorpus, TokenShards
from trainer.data.prefetch import Prefetcher
from trainer.data.prepare import PrepareError, ShardWriter, main, prepare
from trainer.data.shards import METADATA, read_metadata


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, write_corpus(root)


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "ds"
    prepare(
        inputs=[str(corpus[0])], output=str(out), vocab_size=300, val_fraction=0.2, progress=False, log=lambda *a: None
    )
    return out


@pytest.fixture(scope="module")
def default_prepared(corpus, tmp_path_factory) -> Path:
    """The corpus prepared with prepare's defaults but a 300-token vocabulary: tests that damage or rewrite such a
    dataset take a copy (copytree) of this one."""
    out = tmp_path_factory.mktemp("default_prepared") / "ds"
    prepare(inputs=[str(corpus[0])], output=str(out), vocab_size=300, progress=False)
    return out


def _tokens(folder: Path, split: str) -> np.ndarray:
    meta = read_metadata(folder)
    return np.concatenate(
        [np.fromfile(folder / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]]
    ).astype(np.int64)


def test_prepare_writes_shards_that_decode_back_to_the_documents(corpus, dataset):
    from tokenizers import Tokenizer

    _, docs = corpus
    meta = read_metadata(dataset)
    tok = meta["tokenizer"]
    assert tok["vocab_size"] == 300 and meta["dtype"] == "uint16"
    assert meta["splits"]["train"]["documents"] + meta["splits"]["validation"]["documents"] == len(docs)
    assert meta["splits"]["validation"]["documents"] == round(0.2 * len(docs))
    tokenizer = Tokenizer.from_file(str(dataset / tok["file"]))
    decoded = []
    for split in ("train", "validation"):
        ids = _tokens(dataset, split)
        assert len(ids) == meta["splits"][split]["tokens"]
        assert ids[-1] == tok["eos_id"] and ids.max() < tok["vocab_size"]
        bounds = np.flatnonzero(ids == tok["eos_id"])
        assert len(bounds) == meta["splits"][split]["documents"]  # one EOS after each document
        starts = np.concatenate([[0], bounds[:-1] + 1])
        decoded += [tokenizer.decode(ids[a:b].tolist()) for a, b in zip(starts, bounds)]
    assert sorted(decoded) == sorted(docs)  # every document, exactly once, across the two splits
    assert len(ids) < sum(len(d) for d in docs)  # BPE merges: fewer tokens than bytes


def test_prepare_twice_is_a_no_op_and_a_changed_setting_rebuilds(corpus, dataset, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in dataset.iterdir()}
    again = prepare(inputs=[str(corpus[0])], output=str(dataset), vocab_size=300, val_fraction=0.2, progress=False)
    assert again["skipped"] is True
    assert {p.name: p.stat().st_mtime_ns for p in dataset.iterdir()} == before
    copy = tmp_path / "copy"
    meta = prepare(inputs=[str(corpus[0])], output=str(copy), vocab_size=300, val_fraction=0.2, progress=False)
    assert meta["fingerprint"] == read_metadata(dataset)["fingerprint"]
    rebuilt = prepare(inputs=[str(corpus[0])], output=str(copy), vocab_size=280, val_fraction=0.2, progress=False)
    assert "skipped" not in rebuilt and rebuilt["tokenizer"]["vocab_size"] == 280


def test_an_interrupted_run_leaves_no_dataset_that_looks_complete(corpus, default_prepared, tmp_path, monkeypatch):
    out = shutil.copytree(default_prepared, tmp_path / "ds")
    real_write = ShardWriter._write
    calls = []

    def dying_write(self, tokens):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        real_write(self, tokens)

    monkeypatch.setattr(ShardWriter, "_write", dying_write)
    with pytest.raises(KeyboardInterrupt):  # a different setting: rewrites the folder, dies after one shard
        prepare(inputs=[str(corpus[0])], output=str(out), vocab_size=290, shard_tokens=500, progress=False)
    assert not (out / METADATA).exists()
    assert not list(out.glob("*.tmp"))
    with pytest.raises(DataError, match="no metadata.json"):
        TokenShards(path=str(out), global_batch_size=4, seq_len=16).prepare()
    monkeypatch.setattr(ShardWriter, "_write", real_write)
    meta = prepare(inputs=[str(corpus[0])], output=str(out), vocab_size=290, shard_tokens=500, progress=False)
    assert len(meta["splits"]["train"]["shards"]) > 2


def test_loader_batches_depend_on_seed_and_step_only_and_cross_shards(corpus, tmp_path):
    out = tmp_path / "sharded"
    prepare(inputs=[str(corpus[0])], output=str(out), vocab_size=300, shard_tokens=300, progress=False)
    a = TokenShards(path=str(out), global_batch_size=8, seq_len=64, seed=3)
    b = TokenShards(path=str(out), global_batch_size=8, seq_len=64, seed=3)
    a.prepare()
    assert len(a.train_stream.arrays) > 3
    xa, ya = a.global_batch(5)
    xb, yb = b.global_batch(5)
    assert xa.shape == (8, 64) and (xa == xb).all() and (ya == yb).all()
    assert (xa[:, 1:] == ya[:, :-1]).all()
    flat = _tokens(out, "train")
    starts = np.random.default_rng([3, 5]).integers(0, len(flat) - 65, size=8)
    expect = np.stack([flat[s : s + 65] for s in starts])
    assert (xa.numpy() == expect[:, :-1]).all()  # windows read across shard boundaries
    vx, vy = a.val_batch(0)
    val = _tokens(out, "validation")
    assert (vx[0].numpy() == val[:64]).all() and (vy[0].numpy() == val[1:65]).all()
    assert (a.val_batch(1)[0] == b.val_batch(1)[0]).all()


def test_bad_datasets_are_refused_with_the_file_and_the_fix(corpus, default_prepared, tmp_path):
    def fresh(name: str, **kw) -> Path:
        out = tmp_path / name
        if not kw:
            return shutil.copytree(default_prepared, out)
        prepare(inputs=[str(corpus[0])], output=str(out), vocab_size=300, progress=False, **kw)
        return out

    def load(folder: Path) -> TokenShards:
        data = TokenShards(path=str(folder), global_batch_size=4, seq_len=16)
        data.prepare()
        return data

    out = fresh("truncated")
    shard = out / "train_00000.bin"
    shard.write_bytes(shard.read_bytes()[:-6])
    with pytest.raises(DataError, match=r"train_00000.bin is truncated.*prepare the dataset again"):
        load(out)
    shard.unlink()
    with pytest.raises(DataError, match=r"train_00000.bin is missing"):
        load(out)
    shard.write_bytes(b"")
    with pytest.raises(DataError, match=r"train_00000.bin is empty"):
        load(out)

    out = fresh("mismatch")
    meta = json.loads((out / METADATA).read_text())
    meta["splits"]["train"]["tokens"] += 10
    (out / METADATA).write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"records .* tokens but its shards hold"):
        load(out)

    data = load(fresh("vocab"))
    with pytest.raises(DataError, match=r"has 300 tokens but model.vocab_size=256; set model.vocab_size=300"):
        data.check_vocab(256)
    data.check_vocab(300)

    data = load(fresh("noval", val_fraction=0.0))
    assert data.check_validation(eval_every=0, eval_batches=4) is None
    with pytest.raises(DataError, match=r"validation split is empty .* trainer.eval_every=10"):
        data.check_validation(eval_every=10, eval_batches=4)
    with pytest.raises(DataError, match="no such folder"):
        TokenShards(path=str(tmp_path / "nowhere"), global_batch_size=4, seq_len=16).prepare()


def test_refused_before_any_worker_starts(compose_cfg, dataset, tmp_path):
    """trainer.task.train checks the data before launching: no logs/ folder (no worker) is created."""
    from trainer.task import train
    from trainer.validate import ConfigError

    base = ("parallel=single", "logger=none", "data=tokens", f"data.path={dataset}", "data.seq_len=16")
    with pytest.raises(DataError, match="model.vocab_size=256"):
        train(compose_cfg(*base), run_dir=tmp_path / "a", run_meta={})
    with pytest.raises(ConfigError, match="data=tokens needs data.path=.*python -m trainer.data.prepare"):
        train(compose_cfg("data=tokens", "logger=none"), run_dir=tmp_path / "b", run_meta={})
    missing = tmp_path / "data" / "my_corpus"  # the README's second command before its first
    with pytest.raises(
        ConfigError, match=re.escape(f"python -m trainer.data.prepare --input FILES --output {missing}")
    ):
        train(compose_cfg("data=tokens", f"data.path={missing}", "logger=none"), run_dir=tmp_path / "b", run_meta={})
    with pytest.raises(ConfigError, match="trainer.objective=val_loss needs an evaluation"):
        train(compose_cfg("trainer.objective=val_loss", "logger=none"), run_dir=tmp_path / "c", run_meta={})
    text = compose_cfg("parallel=single", "logger=none", "data.val_fraction=0", "trainer.eval_every=5")
    with pytest.raises(DataError, match="validation split is empty"):
        train(text, run_dir=tmp_path / "d", run_meta={})
    assert not any((tmp_path / d / "logs").exists() for d in "abcd")


def test_text_corpus_holds_out_its_tail(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 40)
    data = TextCorpus(path=str(path), global_batch_size=4, seq_len=32, val_fraction=0.25)
    assert len(data.train_stream) + len(data.val_stream) == 256 * 40
    assert len(data.val_stream) == 256 * 10
    x, _ = data.val_batch(0)
    assert (x[0].numpy() == np.arange(32)).all()  # the held-out tail starts at byte 7680 = 0 mod 256
    assert data.global_batch(1)[0].shape == (4, 32)


def test_prepare_cli_refuses_bad_input(tmp_path, capsys):
    assert main(["--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "o")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    assert main(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "in" / "out")]) == 2
    assert "inside --input" in capsys.readouterr().err
    with pytest.raises(PrepareError, match="at least 257"):
        prepare(inputs=[str(tmp_path / "in")], output=str(tmp_path / "o"), vocab_size=100)


def test_prefetcher_keeps_order_reports_waits_and_raises_in_the_loop():
    second_started = threading.Event()

    def make(step: int) -> int:
        if step == 4:
            raise ValueError("bad step 4")
        if step == 2:
            second_started.set()
        time.sleep(0.02)
        return step * 10

    pre = Prefetcher(make, first_step=1, last_step=6, depth=2)
    # the thread runs ahead while the "step" runs: once it makes step 2, step 1 waits in the queue (an event, not a
    # sleep, so a loaded machine cannot make the thread late)
    assert second_started.wait(timeout=60)
    got, waited = pre.get(1)
    assert got == 10 and waited < 0.5  # taken from the queue, not made while the loop waits (that takes 0.02 s+)
    assert [pre.get(s)[0] for s in (2, 3)] == [20, 30]
    with pytest.raises(ValueError, match="bad step 4"):
        pre.get(4)
    pre.close()
    inline = Prefetcher(lambda s: s, first_step=1, last_step=2, depth=0)
    assert inline.get(1)[0] == 1 and inline.get(2)[0] == 2


def test_prefetcher_waits_without_waking_and_closes_while_its_queue_is_full():
    """The thread blocks on its full queue (no put with a timeout: it would wake 10 times a second for the
    interpreter lock) and close() still ends it at once, a step of 100 left unmade."""
    made: list[int] = []
    pre = Prefetcher(lambda s: made.append(s) or s, first_step=1, last_step=100, depth=2)
    deadline = time.monotonic() + 60
    while len(made) < 3 and time.monotonic() < deadline:  # steps 1 and 2 queued, step 3 made and waiting to go in
        time.sleep(0.01)
    switches = _voluntary_switches(pre._thread.native_id)
    time.sleep(0.5)
    assert _voluntary_switches(pre._thread.native_id) - switches <= 1  # asleep, not polling (5 wake-ups before)
    assert made == [1, 2, 3] and pre.get(1)[0] == 1
    t0 = time.perf_counter()
    pre.close()
    assert not pre._thread.is_alive() and time.perf_counter() - t0 < 2.0
    assert len(made) <= 5


def _voluntary_switches(tid: int) -> int:
    """How many times the thread went to sleep (Linux's per-thread count)."""
    with open(f"/proc/self/task/{tid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def test_report_ranks_by_validation_loss(tmp_path):
    from trainer.report.cli import main as report_main

    for num, (tps, val) in enumerate([(900.0, 2.5), (1200.0, 2.9), (1000.0, 2.1)]):
        folder = tmp_path / str(num)
        (folder / ".hydra").mkdir(parents=True)
        cfg = {"parallel": {"name": "single"}, "logger": {"wandb": {"mode": "disabled"}}}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
        (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"optim.lr={num}"]))
        summary = {
            "status": "completed",
            "tokens_per_s": tps,
            "val_loss": val,
            "best_val_loss": val - 0.05,
            "layout": {"strategy": "single", "dp": 1, "tp": 1, "pp": 1},
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    assert report_main([str(tmp_path), "--wandb", "disabled", "--rank-by", "val_loss"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "**Best** (★): job 2, validation loss 2.1000 — `optim.lr=2`" in report
    assert "Ranked by validation loss (lowest first)." in report
    table = [line for line in report.splitlines() if line.startswith("| ") and "dp1" in line]
    assert [line.split("|")[1].strip().lstrip("★◆ ") for line in table] == ["2", "0", "1"]
    assert "| 2.1000 | 2.0500 |" in table[0]
    assert report_main([str(tmp_path), "--wandb", "disabled"]) == 0  # default: best by tokens/s
    assert "**Best** (★): job 1, 1,200 tokens/s" in (tmp_path / "report.md").read_text()


def test_val_loss_search_config_minimises(compose_cfg):
    cfg = compose_cfg("hparams_search=val_loss", return_hydra_config=True)
    assert cfg.trainer.objective == "val_loss" and cfg.trainer.eval_every > 0
    assert cfg.hydra.sweeper.direction == "minimize"


def test_a_resumed_run_counts_the_evaluations_and_the_first_loss_before_its_checkpoint(tmp_path):
    from trainer.loop.fit import history_before

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0, "val_loss": 4.5}, {"step": 4, "val_loss": 4.1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert history_before(path, through_step=3) == ([(2, 4.5)], (1, 5.0))
    assert history_before(path, through_step=4) == ([(2, 4.5), (4, 4.1)], (1, 5.0))
    assert history_before(path, through_step=0) == ([], None)
    assert history_before(tmp_path / "missing.jsonl", through_step=4) == ([], None)
