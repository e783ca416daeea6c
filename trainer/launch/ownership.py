"""One owner per run folder: an OS file lock on ``<folder>/.meshtrain-owner``, held by the job's launching process.

Two jobs writing one folder interleave metrics.jsonl and overwrite each other's checkpoints, and neither
notices. So the process that launches a job (the one running the elastic agent; under torchrun or srun,
global rank 0; in a multi-node job, node 0's) takes ``fcntl.flock`` on the folder's lock file before Hydra or
the job writes into it, and holds it until it exits. The lock belongs to that open file, not to the file
on disk: the kernel drops it when the process ends however it ends, so a killed job never leaves a stale
lock, a requeued Slurm job (a new process) takes it over, and an elastic restart (new workers, same
agent) keeps it. The file stays behind; its text names the last holder (host, pid, start time, command),
which is what a refused job prints. A multirun holds its sweep folder the same way, and each job its own.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from trainer.launch.environment import detect_external_launch

log = logging.getLogger("meshtrain")

LOCK_FILE = ".meshtrain-owner"


class FolderBusy(RuntimeError):
    """Another live job holds the folder; the message names it and what to do."""


@dataclass
class _Held:
    fd: int
    count: int
    created: tuple[Path, ...] = ()
    """The folder and its ancestors this process made, deepest first: a run refused before it wrote anything takes
    them away again (``discard``)."""


#: folders this process holds: hold() is re-entrant (the Hydra callback, then the task, take the same folder)
_held: dict[str, _Held] = {}


def owns_folders(*, node_rank: int, environ: dict[str, str] | None = None) -> bool:
    """Whether this process is the one that holds the job's folder: global rank 0 under torchrun/srun,
    node 0's launcher otherwise (the other ranks and nodes write into a folder someone else holds)."""
    external = detect_external_launch(environ)
    if external is not None:
        return external.rank == 0
    return node_rank == 0


def hold(folder: Path, *, fix: str) -> None:
    """Take ``folder`` for this process (re-entrant) or raise FolderBusy naming the holder; ``fix`` is the
    override that points a job elsewhere (``hydra.run.dir=...`` or ``hydra.sweep.dir=...``)."""
    folder = Path(folder).resolve()
    key = str(folder)
    if key in _held:
        _held[key].count += 1
        return
    created = tuple(p for p in (folder, *folder.parents) if not p.exists())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FolderBusy(_busy_message(folder, fix=fix)) from None
        # e.g. a Lustre mount without -o flock: say so once, and run unguarded rather than not at all
        log.warning(
            "warning: %s: file locks are not supported here (%s); run-folder ownership is not enforced, "
            "make sure no other job uses this folder",
            folder,
            os.strerror(exc.errno or 0),
        )
        _held[key] = _Held(fd=-1, count=1, created=created)
        return
    _write_holder(fd)
    _held[key] = _Held(fd=fd, count=1, created=created)


def release(folder: Path) -> None:
    """Give up one hold() of ``folder``; the lock goes with the last one (or with the process)."""
    key = str(Path(folder).resolve())
    held = _held.get(key)
    if held is None:
        return
    held.count -= 1
    if held.count > 0:
        return
    del _held[key]
    if held.fd >= 0:
        os.close(held.fd)  # closing the only descriptor of the open file drops the flock


#: what a run folder holds before its job wrote anything: Hydra's config files and the lock
UNWRITTEN = {".hydra", LOCK_FILE}


def discard(folder: Path) -> bool:
    """Remove ``folder`` if this process made it and nothing but Hydra's files and the lock is in it, and the
    ancestors it made with it that are left empty (``outputs/<date>``): a refused command leaves no run folder that
    would sort as the newest run. Call while holding it; True when it was removed."""
    import shutil

    folder = Path(folder).resolve()
    held = _held.get(str(folder))
    if held is None or folder not in held.created or not folder.is_dir():
        return False
    if any(p.name not in UNWRITTEN for p in folder.iterdir()):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    for parent in held.created[1:]:
        try:
            parent.rmdir()  # only when empty: another run may have written there since
        except OSError:
            break
    return not folder.exists()


def _write_holder(fd: int) -> None:
    """Who holds it, in the file itself (rewritten in place: replacing the file would orphan the lock)."""
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "started_unix": time.time(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else "",
    }
    data = (json.dumps(info, indent=2) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def read_holder(folder: Path, *, wait_s: float = 1.0) -> dict[str, Any]:
    """The holder recorded in ``folder``'s lock file; {} when there is none (retried for ``wait_s``: the holder
    writes it just after taking the lock)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = json.loads((Path(folder) / LOCK_FILE).read_text())
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and "pid" in info:
            return info
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.05)


def _busy_message(folder: Path, *, fix: str) -> str:
    info = read_holder(folder)
    if info.get("pid") is not None:
        who = (
            f"pid {info['pid']} on host {info.get('host', '?')}, started {info.get('started', '?')}"
            f" ({info.get('command', '')})"
        )
        stop = f"stop it (kill {info['pid']} on {info.get('host', 'its host')})"
    else:
        who, stop = "a process that has not recorded itself yet", "stop it"
    return (
        f"run folder {folder} is in use by another job: {who}. One job writes a run folder at a time. "
        f"Wait for that job to end, {stop} and rerun this command to continue from its checkpoint, "
        f"or give this job its own folder ({fix}=<another folder>). A job that was killed frees the folder by itself."
    )


class FolderOwner(Callback):
    """Hydra callback (conf/config.yaml): takes the run folder of a single run, or the sweep folder of a
    multirun, before Hydra writes its ``.hydra/`` files into it; a held folder ends the command with exit 2.
    Each job of a multirun takes its own folder in ``trainer.task.run_task``."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _take(config, Path(str(config.hydra.run.dir)), fix="hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _take(config, Path(str(config.hydra.sweep.dir)), fix="hydra.sweep.dir")


def _take(config: DictConfig, folder: Path, *, fix: str) -> None:
    if not owns_folders(node_rank=int(OmegaConf.select(config, "topology.node_rank", default=0) or 0)):
        return
    try:
        hold(folder, fix=fix)
    except FolderBusy as exc:
        print(f"meshtrain: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
