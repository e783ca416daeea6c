"""Every file a run appends to or rewrites, cut at seeded random byte offsets and read back in-process: the
whole records are kept, nothing raises, one warning names the file and the line; resume cuts metrics.jsonl
back to whole records before appending. (tests/integration/test_run_folder_ownership.py resumes real cut
copies.)"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from trainer.checkpoint.files import CheckpointError, complete_checkpoints, read_marker
from trainer.launch.attempts import previous_attempt_report, write_exit_record
from trainer.observe.durable import json_line, read_json, read_whole_json, write_json
from trainer.observe.metrics import MetricsFile, read_metrics
from trainer.observe.wandb_run import RunIdentity
from trainer.sweeps.jobs import read_job

OFFSETS = 40  # random cuts per file, seeded


def cuts(size: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return sorted({0, 1, size - 1, *(rng.randrange(size) for _ in range(OFFSETS))})


def cut_copy(src: Path, dst: Path, offset: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes()[:offset])
    return dst


def records(n: int) -> list[dict]:
    return [{"step": s, "loss": 5.5 - 0.123456789 * s, "lr": 3e-4, "tokens_per_s": 1234.5 + s} for s in range(1, n + 1)]


def torn_warnings(caplog, path: Path) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]


def member_ends(obj: dict) -> list[int]:
    """Where each top-level member of ``write_json(obj)``'s text ends, its delimiter included."""
    ends, items = [], list(obj.items())
    for i in range(len(items)):
        text = json.dumps(dict(items[: i + 1]), indent=2)
        ends.append(len(text) if i == len(items) - 1 else len(text) - 1)  # "...,\n" vs "...\n}"
    return ends


def test_metrics_jsonl_keeps_whole_records_at_every_cut(tmp_path, caplog):
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json_line(r) for r in records(12)))
    data = whole.read_bytes()
    for offset in cuts(len(data), seed=1):
        path = cut_copy(whole, tmp_path / f"cut{offset}" / "metrics.jsonl", offset)
        caplog.clear()
        got = read_metrics(path)
        # a record is whole once its closing brace is in: the newline may be what was lost
        expected = [r for r in records(12) if data.index(json_line(r).encode()) + len(json_line(r)) - 1 <= offset]
        assert got == expected, offset
        on_boundary = offset == 0 or data[offset - 1 : offset] == b"\n" or data[offset - 1 : offset] == b"}"
        warned = torn_warnings(caplog, path)
        assert len(warned) == (0 if on_boundary else 1), (offset, warned)
        if warned:
            assert f"line {len(got) + 1}" in warned[0] and "torn" in warned[0]
            read_metrics(path)  # read again: no second warning
            assert len(torn_warnings(caplog, path)) == 1


def test_resume_cuts_metrics_back_to_whole_records_then_appends(tmp_path):
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json_line(r) for r in records(12)))
    size = whole.stat().st_size
    for offset in cuts(size, seed=2):
        for keep in (4, 12):
            path = cut_copy(whole, tmp_path / f"cut{offset}-{keep}" / "metrics.jsonl", offset)
            before = [r["step"] for r in read_metrics(path)]
            sink = MetricsFile(path, keep_through_step=keep)
            sink.write({"step": 99, "loss": 1.0})
            sink.close()
            lines = path.read_text().splitlines(keepends=True)
            assert all(line.endswith("\n") for line in lines), offset
            steps = [json.loads(line)["step"] for line in lines]  # every line parses: nothing torn is left
            assert steps == [s for s in before if s <= keep] + [99], (offset, keep)


def test_resume_rewrites_metrics_when_a_torn_line_sits_among_kept_ones(tmp_path):
    path = tmp_path / "metrics.jsonl"
    text = "".join(json_line(r) for r in records(6))
    lines = text.splitlines(keepends=True)
    path.write_text(lines[0] + lines[1] + "56}\n" + "".join(lines[3:]))  # two writers interleaved, as issue 24 saw
    sink = MetricsFile(path, keep_through_step=5)
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 4, 5]


def test_rewritten_json_files_keep_their_whole_members(tmp_path, caplog):
    summary = {
        "status": "completed",
        "strategy": "ddp",
        "final_loss": 2.345678,
        "layout": {"dp": 2, "tp": 1, "rank_map": [{"rank": 0}, {"rank": 1}]},
        "tokens_per_s": 10896.7,
        "stop_signals": ["SIGTERM"],
        "last_step": 20,
    }
    whole = tmp_path / "summary.json"
    write_json(whole, summary)
    data = whole.read_bytes()
    ends = member_ends(summary)
    assert data.decode().startswith(json.dumps(summary, indent=2))
    for offset in cuts(len(data), seed=3):
        path = cut_copy(whole, tmp_path / f"cut{offset}" / "summary.json", offset)
        caplog.clear()
        got = read_json(path, default="missing")
        keys = [k for k, end in zip(summary, ends) if end <= offset]
        if offset >= len(data) - 1:  # only the final newline (or nothing) lost: the file is whole
            assert got == summary
            continue
        assert got == ({k: summary[k] for k in keys} if offset > 0 else "missing"), offset
        warned = torn_warnings(caplog, path)
        assert len(warned) == 1 and "torn or truncated JSON" in warned[0], (offset, warned)


def test_requeues_list_keeps_whole_records(tmp_path):
    history = [
        {"kind": "timeout", "signals": ["SIGUSR2"], "stopped_at_step": 10, "checkpoint_step": 10},
        {"kind": "preemption", "signals": ["SIGTERM"], "stopped_at_step": 17, "checkpoint_step": 15},
    ]
    whole = tmp_path / "requeues.json"
    write_json(whole, history)
    data = whole.read_bytes()
    first_end = data.index(b"},") + 2
    for offset in cuts(len(data), seed=4):
        got = read_json(cut_copy(whole, tmp_path / f"cut{offset}" / "requeues.json", offset), default=[])
        expected = history if offset >= len(data) - 1 else history[:1] if offset >= first_end else []
        assert got == expected, offset


def test_sweep_job_reader_survives_torn_summary_status_and_requeues(tmp_path):
    """The report's and the sweep callback's reader (trainer/sweeps/jobs.py) on a job folder whose files are
    all cut: it never raises, and a summary cut before its status does not pass for a completed job."""
    job = tmp_path / "src" / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- trainer.seed=1\n")
    write_json(job / "summary.json", {"status": "completed", "final_loss": 2.5, "tokens_per_s": 1e4})
    write_json(job / "status.json", {"status": "preempted", "reason": "signal", "overrides": ["trainer.seed=1"]})
    write_json(job / "requeues.json", [{"kind": "timeout", "stopped_at_step": 3}])
    rng = random.Random(5)
    for trial in range(OFFSETS):
        folder = tmp_path / f"t{trial}" / "0"
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text("- trainer.seed=1\n")
        for name in ("summary.json", "status.json", "requeues.json"):
            data = (job / name).read_bytes()
            (folder / name).write_bytes(data[: rng.randrange(len(data))])
        got = read_job(folder)
        summary = read_json(folder / "summary.json", default={})
        if "status" in summary:
            assert got.status == "completed" and got.summary == summary
        else:
            assert got.summary is None and got.status in ("preempted", "failed")
        assert all(isinstance(r, dict) for r in got.requeues) and got.overrides == ["trainer.seed=1"]


def test_wandb_run_id_survives_a_cut_that_spares_it(tmp_path):
    src = tmp_path / "src"
    identity = RunIdentity(src)
    identity.started()
    identity.logged(17)
    whole = src / "wandb_run.json"
    data = whole.read_bytes()
    id_end = data.index(b'"id": ') + len(f'"id": "{identity.id}",')
    for offset in cuts(len(data), seed=6):
        folder = tmp_path / f"cut{offset}"
        cut_copy(whole, folder / "wandb_run.json", offset)
        again = RunIdentity(folder)
        assert (again.id == identity.id) == (offset >= id_end), offset
        assert again.resumed == (offset >= id_end)
        assert again.last_step in (0, 17)


def test_a_torn_checkpoint_marker_is_skipped_by_auto_and_refused_by_path(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        ckpt = root / f"step_{step:07d}"
        ckpt.mkdir(parents=True)
        (ckpt / "__0_0.distcp").write_bytes(b"x" * 100)
        write_json(ckpt / "meshtrain.json", {"step": step, "files": {"__0_0.distcp": 100}, "scheduler": {}})
    marker = root / "step_0000004" / "meshtrain.json"
    data = marker.read_bytes()
    for offset in cuts(len(data), seed=7):
        if offset >= len(data) - 1:
            continue
        marker.write_bytes(data[:offset])
        caplog.clear()
        assert [s for s, _ in complete_checkpoints(root)] == [2], offset
        assert read_whole_json(marker)[0] is None
        with pytest.raises(CheckpointError, match=r"marker meshtrain.json that is torn or truncated at line \d+"):
            read_marker(marker.parent)
    marker.write_bytes(data)
    assert [s for s, _ in complete_checkpoints(root)] == [2, 4]
    (root / "step_0000004" / "__0_0.distcp").write_bytes(b"x" * 60)  # a shard cut short: passed over too
    assert [s for s, _ in complete_checkpoints(root)] == [2]


def test_a_torn_exit_record_counts_as_a_rank_that_died_writing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    write_exit_record(tmp_path, 0, error=RuntimeError("boom"))
    write_exit_record(tmp_path, 1, error=None)
    record = tmp_path / "logs" / "attempts" / "0" / "rank0.json"
    data = record.read_bytes()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    for offset in cuts(len(data), seed=8):
        record.write_bytes(data[:offset])
        report = previous_attempt_report(tmp_path, 2)
        kept = read_json(record, default={})
        if {"rank", "time", "error"} <= kept.keys():
            assert "rank 0 failed first" in report, offset
        else:
            assert "rank(s) [0] died without an exit record" in report, offset
