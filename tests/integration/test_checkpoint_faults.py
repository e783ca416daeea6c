"""Checkpoint faults: background (async) saves keep the marker guarantees and resume exactly; a save that
cannot be written (the file-size limit makes every large write fail, as a full disk does) fails that save
cleanly while the previous checkpoint stays intact and training goes on; timeouts are told by type."""

from __future__ import annotations

import pytest

from tests.helpers import FAST, TrainRun, run_train
from trainer.checkpoint.files import checkpoints_root, complete_checkpoints, read_marker

pytestmark = pytest.mark.slow


def test_async_checkpoint_resumes_bit_exactly(tmp_path):
    job = ("parallel=ddp", *FAST, "trainer.checkpoint_every=4", "trainer.async_checkpoint=true")
    straight = run_train(*job, "trainer.max_steps=8", run_dir=tmp_path / "straight")
    log = (straight.run_dir / "logs" / "rank0.log").read_text()
    assert "checkpoint step 4: writing in the background" in log and "checkpoint step 4 saved" in log
    assert [s for s, _ in complete_checkpoints(checkpoints_root(straight.run_dir))] == [4, 8]
    assert not list(checkpoints_root(straight.run_dir).glob(".tmp-*"))
    ckpt = straight.run_dir / "checkpoints" / "step_0000004"
    assert read_marker(ckpt)["step"] == 4
    resumed = run_train(*job, "trainer.max_steps=8", f"trainer.resume={ckpt}", run_dir=tmp_path / "resumed")
    want = [(m["loss"], m["grad_norm"]) for m in straight.metrics()[4:]]
    assert [(m["loss"], m["grad_norm"]) for m in resumed.metrics()] == want


def limited_run(run_dir, *overrides: str, max_file_bytes: int) -> TrainRun:
    """train.py with RLIMIT_FSIZE: any write past ``max_file_bytes`` fails with EFBIG (Python ignores
    SIGXFSZ), the way writes fail on a full disk."""
    return run_train(*overrides, run_dir=run_dir, expect_ok=False, max_file_bytes=max_file_bytes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_save_that_cannot_be_written_fails_cleanly(tmp_path, mode):
    job = ("parallel=single", *FAST, "trainer.checkpoint_every=4", f"trainer.async_checkpoint={mode == 'async'}")
    run_dir = tmp_path / "run"
    run_train(*job, "trainer.max_steps=4", run_dir=run_dir)
    before = {p.name: p.stat().st_size for p in (run_dir / "checkpoints" / "step_0000004").iterdir()}
    run = limited_run(run_dir, *job, "trainer.max_steps=8", max_file_bytes=1 << 20)
    assert run.proc.returncode == 0, run.output[-3000:]
    lines = [line for line in run.output.splitlines() if "checkpoint step 8 NOT saved" in line]
    assert len(lines) == 1, run.output[-3000:]
    assert "step_0000004 is intact" in lines[0] and "training goes on" in lines[0]
    assert "checkpoint step 8 saved" not in run.output
    assert run.summary()["checkpoints_not_saved"] == [8] and run.summary()["last_step"] == 8
    found = complete_checkpoints(checkpoints_root(run_dir))
    assert [s for s, _ in found] == [4] and not list(checkpoints_root(run_dir).glob(".tmp-*"))
    assert {p.name: p.stat().st_size for p in found[0][1].iterdir()} == before
    read_marker(found[0][1])  # still complete and whole
