"""What a person sees before and during a run (issue 42): the start-up clock's lines, the console's line at least
every 30 s off a terminal, where a rank sits on the mesh, and the closing list of what the run folder holds."""

from __future__ import annotations

import logging
import time

import pytest

from parallel.foundation.layout import ParallelLayout
from trainer.launch.worker import layout_label, mesh_place
from trainer.observe.console import HEARTBEAT_S, ConsoleSink
from trainer.observe.files_sink import output_listing
from trainer.observe.startup import STARTED_KEY, StartClock, process_started_unix


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def lines():
    log = logging.getLogger("test-startup-progress")
    log.setLevel(logging.INFO)
    handler = _Lines()
    log.addHandler(handler)
    yield log, handler.lines
    log.removeHandler(handler)


def test_clock_counts_from_the_process_start_and_reaches_the_workers(capsys, monkeypatch):
    started = process_started_unix()
    assert started <= time.time()
    single = StartClock.for_job(multirun=False)
    assert single.started_unix == pytest.approx(started)
    assert StartClock.from_meta({STARTED_KEY: single.started_unix}) == single  # the worker's clock is the launcher's
    job = StartClock.for_job(multirun=True)  # a multirun job counts from its own start
    assert job.started_unix >= started
    clock = StartClock(time.time() - 2.5)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    clock.say("preparing the data")
    out = capsys.readouterr().out
    assert out.startswith("[+2.") and out.rstrip().endswith(" s] preparing the data")
    monkeypatch.setenv("RANK", "1")  # torchrun's other ranks run the same code: rank 0 alone says it
    clock.say("preparing the data")
    assert capsys.readouterr().out == ""


def test_console_line_at_least_every_heartbeat_off_a_terminal(lines):
    log, out = lines
    now = [0.0]
    sink = ConsoleSink(total_steps=100, start_step=0, log=log, terminal=False, clock=lambda: now[0])
    assert HEARTBEAT_S == 30.0
    record = {"step": 1, "loss": 5.0, "lr": 1e-3, "step_time_s": 12.0, "tokens_per_s": 100.0}
    now[0] = 12.0
    sink.log_step(record)
    sink.advance(1)
    assert len(out) == 1  # the logged step's own line
    for step in range(2, 10):  # 12 s steps, the next logged step at 10: silent 96 s without the heartbeat
        now[0] += 12.0
        sink.advance(step)
    heartbeats = [line for line in out if "s/step over the last" in line]
    assert [line.split()[1] for line in heartbeats] == ["4", "7"]  # 36 s after step 1, then 36 s after step 4
    assert "12.0 s/step over the last 3 step(s)" in heartbeats[0]


def test_console_on_a_terminal_leaves_it_to_the_bar(lines):
    log, out = lines
    now = [0.0]
    sink = ConsoleSink(total_steps=10, start_step=0, log=log, terminal=True, clock=lambda: now[0])
    try:
        for step in range(1, 5):
            now[0] += 100.0
            sink.advance(step)
        assert out == []
    finally:
        sink.close(exit_code=0)


def test_mesh_place_names_every_dimension_it_prints():
    layout = ParallelLayout(strategy="hybrid", dp=2, tp=2, pp=2, micro_batches=2)
    place = mesh_place(layout, 5)
    assert place == "mesh pp 1/2, dp 0/2, cp 0/1, tp 1/2; ep 0/1 (borrowed)"
    assert layout_label(layout) == "hybrid: pp2 x dp2 x tp2 on 8 ranks"
    assert layout_label(ParallelLayout(strategy="single")) == "single: one rank"


def test_output_listing_is_what_the_folder_holds(tmp_path):
    for name in ("metrics.jsonl", "summary.json", "rank_map.png", "moe_expert_load.png", "dry_run.json"):
        (tmp_path / name).write_text("x")
    for name in ("logs", "timeline", ".hydra", "checkpoints"):
        (tmp_path / name).mkdir()
    (tmp_path / ".meshtrain-owner").write_text("lock")
    listed = output_listing(tmp_path)
    assert listed.startswith(f"outputs in {tmp_path}: ")
    names = listed.split(": ", 1)[1].split(", ")
    assert names == sorted(names)
    assert set(names) == {
        ".hydra/",
        "checkpoints/",
        "dry_run.json",
        "logs/",
        "metrics.jsonl",
        "moe_expert_load.png",
        "rank_map.png",
        "summary.json",
        "timeline/",
    }


def test_more_ranks_than_cores_is_a_warning_before_spawn(compose_cfg, monkeypatch):
    from trainer.checks import topology
    from trainer.validate import validate

    monkeypatch.setattr(topology, "cpu_cores", lambda: 2)
    crowded = validate(compose_cfg("dp.size=8"), environ={})  # still runs: a warning, not a refusal
    (warning,) = [w for w in crowded.warnings if "CPU core" in w]
    assert warning.startswith("8 ranks on this node and 2 CPU core(s)") and "at most 2 ranks per node" in warning
    assert not [w for w in validate(compose_cfg(), environ={}).warnings if "CPU core" in w]  # the default: 2 on 2


def test_a_preparation_says_its_start_progress_and_end():
    from trainer.observe.startup import PREPARATION_EVERY_S, Steps

    said, now = [], [0.0]
    steps = Steps("tokenizing", unit="documents", total=100, say=said.append, clock=lambda: now[0])
    for _ in range(10):  # 10 batches of 10 documents, 2 s each: a line at least every PREPARATION_EVERY_S
        now[0] += 2.0
        steps.advance(10, note="some tokens")
    steps.end("100 documents")
    assert PREPARATION_EVERY_S == 5.0
    assert said[0] == "tokenizing: started (100 documents)"
    assert said[1:-1] == [
        "tokenizing: 30/100 documents (30%), some tokens, 6.0 s",
        "tokenizing: 60/100 documents (60%), some tokens, 12.0 s",
        "tokenizing: 90/100 documents (90%), some tokens, 18.0 s",
    ]
    assert said[-1] == "tokenizing: done, 100 documents, in 20.0 s"


def test_the_default_corpus_says_what_it_reads(capsys, monkeypatch):
    from trainer.data.datasets import _stdlib_sources

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    data = _stdlib_sources(200_000)
    out = capsys.readouterr().out.splitlines()
    assert len(data) == 200_000
    assert out[0].startswith("reading the default corpus from ") and out[0].endswith(": started (200,000 bytes)")
    assert out[-1].startswith("reading the default corpus from ") and ": done, 200,000 bytes from " in out[-1]


def test_token_preparation_off_a_terminal_says_its_start_and_end(tmp_path):
    from tests.helpers import write_corpus
    from trainer.data.prepare import prepare

    write_corpus(tmp_path / "corpus")
    said: list[str] = []
    prepare(
        inputs=[str(tmp_path / "corpus")], output=str(tmp_path / "out"), vocab_size=300, progress=False, log=said.append
    )
    assert any(line.startswith("reading ") and "file(s)" in line for line in said), said
    assert any(line.startswith("BPE trained in ") for line in said), said
    start = next(i for i, line in enumerate(said) if line.startswith("tokenizing: started ("))
    end = next(i for i, line in enumerate(said) if line.startswith("tokenizing: done, "))
    assert start < end and said[end].endswith(" s") and " documents, in " in said[end]


def test_console_says_the_end_line_of_a_completed_run(lines):
    log, out = lines
    sink = ConsoleSink(total_steps=20, start_step=0, log=log, terminal=False)
    done = {"first_loss": 5.0, "first_loss_step": 1, "final_loss": 4.25, "last_step": 20, "tokens_per_s": 1234.0}
    sink.log_summary({**done, "status": "preempted"})
    sink.log_summary({**done, "status": "completed", "final_loss": None})
    assert out == []  # only a completed run with a loss has one
    sink.log_summary({**done, "status": "completed", "samples_per_s": 56.0})
    sink.log_summary({**done, "status": "completed"})
    assert out == [
        "done: loss 5.0000 at step 1 -> 4.2500 at step 20, 56 samples/s (median)",
        "done: loss 5.0000 at step 1 -> 4.2500 at step 20, 1,234 tok/s (median)",
    ]
