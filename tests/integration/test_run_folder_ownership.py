"""A run folder that survives anything, on real jobs (issue 24). One default-layout job (DDP on 2 workers, W&B
offline) serves three tests: while it trains, its listening sockets are read from /proc (all loopback) and
a second job naming its folder is refused; once it is done, copies of its folder with every product-written
file cut at seeded random offsets resume, in one multirun, to its final loss, and the report reads them.
The readers themselves are cut at many more offsets in-process: tests/unit/test_torn_files.py. The lock against a
helper process holding it (a held folder refused naming its holder, freed when that process is killed outright; a
second process refused while this one holds it, re-entrant within one) is here too: tests/unit/test_run_folder_lock.py holds it in process."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.faults import WaitAt, inject
from tests.helpers import FAST, ROOT, run_train
from tests.listeners import listeners_of, process_tree
from trainer.launch.ownership import LOCK_FILE, FolderBusy, hold, read_holder, release
from trainer.observe.durable import write_json

pytestmark = pytest.mark.slow

STEPS = 6
#: the job of every run here: FAST with W&B offline (for wandb_run.json), checkpoints at 2, 4 and 6
JOB = (
    *(o for o in FAST if not o.startswith("logger=")),
    "logger.wandb.mode=offline",
    f"trainer.max_steps={STEPS}",
    "trainer.checkpoint_every=2",
    "trainer.keep_checkpoints=3",
    "trainer.seed=7",
)
COPIES = 3  # cut copies resumed in one multirun: 3 offsets per file


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), *overrides]


ENV = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}


def workers_of(pid: int) -> list[int]:
    """The elastic agent's worker processes: the launcher's children (forked, or spawned by multiprocessing),
    not multiprocessing's resource tracker."""
    out = []
    for child in process_tree(pid)[1:]:
        try:
            stat = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and b"resource_tracker" not in cmdline:
            out.append(child)
    return out


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """Job A, and what was seen while it ran: its listeners, and job B started on its folder while A's workers
    waited before step 3 (tests/faults.py's ``WaitAt`` until the file ``go`` exists: A surely holds the folder
    while B asks for it, and A then finishes unsignalled)."""
    root = tmp_path_factory.mktemp("runfolder")
    run_dir, go = root / "run", root / "go"
    log_a = open(root / "a.out", "w")
    gate = (inject(WaitAt, step=3, file=go),)
    a = subprocess.Popen(
        train_cmd(*JOB, *gate, f"hydra.run.dir={run_dir}"), stdout=log_a, stderr=subprocess.STDOUT, cwd=ROOT, env=ENV
    )
    seen: set = set()
    pids: set[int] = set()
    b, waiting = None, []
    deadline = time.monotonic() + 300
    while a.poll() is None and time.monotonic() < deadline:
        tree = process_tree(a.pid)
        pids.update(tree)
        seen |= listeners_of(tree)
        logs = [run_dir / "logs" / f"rank{r}.log" for r in (0, 1)]
        if b is None and all(p.exists() and "waits before step 3" in p.read_text() for p in logs):
            waiting = workers_of(a.pid)
            seen |= listeners_of(process_tree(a.pid))
            t0 = time.perf_counter()
            # train.py forked from the warm runner: the refusal is train.py's, not the interpreter start's
            b = run_train(*JOB, "trainer.max_steps=7", run_dir=run_dir, expect_ok=False, timeout=120).proc
            b_seconds = time.perf_counter() - t0
            print(f"\nsecond job refused after {b_seconds:.2f} s (wall clock, warm-runner fork to exit)")
            go.touch()
        time.sleep(0.1)
    a.wait(timeout=60)
    log_a.close()
    output = (root / "a.out").read_text()
    assert a.returncode == 0, output[-4000:]
    assert b is not None, f"job A ended before its workers were seen waiting:\n{output[-3000:]}"
    return {"a": a, "b": b, "run_dir": run_dir, "listeners": seen, "workers": waiting, "pids": pids}


def test_a_second_job_on_a_held_folder_is_refused_before_any_worker_starts(held):
    a, b, run_dir = held["a"], held["b"], held["run_dir"]
    assert b.returncode == 2, b.stdout[-2000:] + b.stderr[-2000:]
    assert f"run folder {run_dir.resolve()} is in use by another job: pid {a.pid} on host {socket.gethostname()}" in (
        b.stderr
    )
    assert (
        re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", b.stderr)
        and f"kill {a.pid}" in b.stderr
        and "hydra.run.dir=<another folder>" in b.stderr
    )
    assert "Traceback" not in b.stderr + b.stdout
    # refused before Hydra wrote into the folder and before any worker: A's files are A's alone
    assert f"trainer.max_steps={STEPS}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.max_steps=7" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert len(list((run_dir / "logs" / "elastic").iterdir())) == 1, "a second agent started"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


def test_a_single_node_job_listens_on_loopback_only(held):
    listeners, everything = held["listeners"], sorted(map(str, held["listeners"]))
    # the scan saw what the job opens (the launcher's rendezvous store, each worker's gloo), so it could fail
    assert held["a"].pid in {ln.pid for ln in listeners}, f"the launcher's store was not seen: {everything}"
    assert len(held["workers"]) == 2, held["workers"]
    assert set(held["workers"]) <= {ln.pid for ln in listeners}, f"a worker's listeners were not seen: {everything}"
    exposed = sorted(str(ln) for ln in listeners if not ln.loopback)
    assert not exposed, f"listening beyond the machine: {exposed} (all: {everything})"
    print(f"\nlisteners of the job's {len(held['pids'])} processes: {everything}")


def cut(path: Path, rng: random.Random) -> int:
    data = path.read_bytes()
    offset = rng.randrange(len(data))
    path.write_bytes(data[:offset])
    return offset


def test_copies_cut_at_random_offsets_resume_to_the_final_loss(held, tmp_path):
    src = held["run_dir"]
    ref_losses = {m["step"]: m["loss"] for m in map(json.loads, (src / "metrics.jsonl").read_text().splitlines())}
    ref_final = json.loads((src / "summary.json").read_text())["final_loss"]
    ref_id = json.loads((src / "wandb_run.json").read_text())["id"]
    sweep = tmp_path / "sweep"
    id_spared = {}
    for k in range(COPIES):
        job = sweep / str(k)
        shutil.copytree(src, job)
        shutil.rmtree(job / "checkpoints" / "step_0000006")  # as if killed before its last checkpoint
        # files only a multirun job (status.json) or a Slurm requeue (requeues.json) writes, as they write them
        write_json(
            job / "status.json", {"status": "preempted", "reason": "preempted: checkpoint step 4", "overrides": []}
        )
        write_json(job / "requeues.json", [{"kind": "timeout", "signals": ["SIGUSR2"], "stopped_at_step": 4}] * 2)
        rng = random.Random(24 + k)
        for name in ("metrics.jsonl", "summary.json", "status.json", "requeues.json", "wandb_run.json"):
            offset = cut(job / name, rng)
            if name == "wandb_run.json":
                text = (src / name).read_text()
                id_spared[k] = offset >= text.index(f'"{ref_id}"') + len(ref_id) + 3  # the id, its quote and comma
        cut(job / "checkpoints" / "step_0000004" / "meshtrain.json", rng)  # auto falls back to step 2

    resumed = run_train(
        # one job per copy; only the first opens W&B (and so reads wandb_run.json): W&B costs seconds per job
        *(o for o in JOB if not o.startswith("logger.wandb.mode=")),
        f"logger.wandb.mode=offline{',disabled' * (COPIES - 1)}",
        run_dir=sweep,
        multirun=True,
        expect_ok=False,
        timeout=600,
    ).proc
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and f"{COPIES} jobs: {COPIES} completed" in out, out[-5000:]
    for k in range(COPIES):
        job = sweep / str(k)
        log0 = (job / "logs" / "rank0.log").read_text()
        assert "has a marker meshtrain.json that is torn or truncated at line" in log0
        assert f"resumed from {job}/checkpoints/step_0000002 at step 2" in log0
        summary = json.loads((job / "summary.json").read_text())
        assert summary["final_loss"] == ref_final, (k, summary["final_loss"], ref_final)
        records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]  # all whole
        steps = [r["step"] for r in records]
        assert steps == sorted(set(steps)) and steps[-STEPS + 2 :] == list(range(3, STEPS + 1)), (k, steps)
        assert all(r["loss"] == ref_losses[r["step"]] for r in records), k
    run_id = json.loads((sweep / "0" / "wandb_run.json").read_text())["id"]  # rewritten whole by the resume
    assert (run_id == ref_id) == id_spared[0], (run_id, ref_id, id_spared[0])

    report = subprocess.run(
        [sys.executable, "-m", "trainer.report", str(sweep), "--wandb", "disabled"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=300,
    )
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert f"{COPIES} jobs: {COPIES} completed" in report.stdout
    assert "requeues.json line" in report.stderr or "status.json line" in report.stderr  # torn, read, warned
    assert (sweep / "report.md").exists()


# ---- the lock against another process (the lock itself in process: tests/unit/test_run_folder_lock.py) ----------


def holder_process(folder) -> subprocess.Popen:
    """Another process that takes ``folder`` and keeps it until killed."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from trainer.launch.ownership import hold
        hold({str(folder)!r}, fix="hydra.run.dir")
        print("held", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_folder_is_refused_naming_its_holder_and_freed_when_it_is_killed(tmp_path):
    folder = tmp_path / "run"
    other = holder_process(folder)
    try:
        with pytest.raises(FolderBusy) as err:
            hold(folder, fix="hydra.run.dir")
        message = str(err.value)
        assert f"pid {other.pid} on host {socket.gethostname()}, started " in message
        assert f"kill {other.pid}" in message and "hydra.run.dir=<another folder>" in message
        assert read_holder(folder)["pid"] == other.pid
    finally:
        other.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops the lock with the process
        other.wait()
    hold(folder, fix="hydra.run.dir")
    try:
        assert read_holder(folder)["pid"] == os.getpid()  # the holder's record is rewritten, not stale
    finally:
        release(folder)
    assert (folder / LOCK_FILE).exists()  # the file stays; the lock does not


def test_hold_is_reentrant_and_the_last_release_frees_the_folder(tmp_path):
    folder = tmp_path / "run"
    hold(folder, fix="hydra.run.dir")
    hold(folder / ".", fix="hydra.run.dir")  # the callback, then the task: one process, one lock
    release(folder)
    code = f"from trainer.launch.ownership import hold; hold({str(folder)!r}, fix='x')"
    still = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert still.returncode != 0 and "FolderBusy" in still.stderr and f"pid {os.getpid()}" in still.stderr
    release(folder)
    free = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert free.returncode == 0, free.stderr
