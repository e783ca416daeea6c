"""A one-node Slurm on this machine, for the `slurm` tests and for trying the Slurm launcher by hand.

    python -m benchmarks.slurm_cluster start [--dir /tmp/meshtrain-slurm] [--install]
    export SLURM_CONF=/tmp/meshtrain-slurm/slurm.conf     # printed by `start`
    python train.py -m hydra/launcher=slurm hydra.launcher.partition=debug parallel=ddp trainer.seed=1,2
    python -m benchmarks.slurm_cluster stop [--dir /tmp/meshtrain-slurm]

Debian's packages (``slurmctld slurmd slurm-client munge``; ``--install`` runs apt-get for them) give
the daemons; everything else lives under one folder: a munge key and socket, ``slurm.conf`` naming
this host as the only node (all its CPUs, ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``AuthType=auth/munge``, partition ``debug``, no accounting database), the controller's state, the
daemons' logs and pid files. Nothing under /etc is changed: clients find the cluster through
``SLURM_CONF``. ``start`` returns once ``sinfo`` shows the node idle, or raises with the daemons' logs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trainer.launch.environment import rendezvous_port

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
DEFAULT_DIR = Path("/tmp/meshtrain-slurm")
PARTITION = "debug"


class SlurmUnavailable(RuntimeError):
    """The one-node Slurm could not be installed or started; the message says why and where to look."""


@dataclass
class Cluster:
    root: Path
    node: str
    cpus: int
    setup_s: float = 0.0

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, submitit, scontrol inside a job) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(cmd), env={**os.environ, **self.env}, capture_output=True, text=True, check=check, timeout=timeout
        )

    def node_state(self) -> str:
        proc = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return proc.stdout.strip() if proc.returncode == 0 else f"sinfo failed: {proc.stderr.strip()}"


def missing_binaries() -> list[str]:
    return [name for name in (*DAEMONS, "sinfo", "sbatch", "scontrol", "mungekey") if not _which(name)]


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()), None)


def install() -> float:
    """apt-get the Debian packages (needs root); returns the seconds it took."""
    t0 = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SlurmUnavailable(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: job ids one cluster hands out before its jobs' rendezvous ports could meet another cluster's
JOB_ID_BLOCK = 100


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def first_job_id() -> int:
    """The cluster's ``FirstJobId``: a random block of ``JOB_ID_BLOCK`` job ids whose rendezvous ports
    (``rendezvous_port``: a Slurm job's MASTER_PORT comes from its job id) no process listens on now. Every cluster
    started at job 1 before, so two of them on one host (a suite beside a rerun of the Slurm tests, two sessions)
    gave their jobs the same MASTER_PORT: a job whose port another cluster's job held could not start or joined the
    other job's store."""
    block = JOB_ID_BLOCK
    for _ in range(50):
        block = random.randrange(1, 19_000 // JOB_ID_BLOCK) * JOB_ID_BLOCK
        if all(_port_free(rendezvous_port(str(i))) for i in range(block, block + JOB_ID_BLOCK)):
            break
    return block


def write_config(root: Path, *, node: str, cpus: int) -> Path:
    for sub in ("munge", "state/ctld", "state/d", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = f"""\
# one-node Slurm written by benchmarks/slurm_cluster.py
ClusterName=meshtrain
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
FirstJobId={first_job_id()}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also the delay before a requeued job may start again (Slurm default 120 s)
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SchedulerParameters=sched_interval=2
StateSaveLocation={root}/state/ctld
SlurmdSpoolDir={root}/state/d
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    path = root / "slurm.conf"
    path.write_text(conf)
    return path


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _logs(root: Path) -> str:
    parts = []
    for name in ("munge/munged.log", "log/slurmctld.log", "log/slurmd.log"):
        path = root / name
        if path.exists():
            parts.append(f"--- {path} (last lines)\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(parts)


def start(root: Path = DEFAULT_DIR, *, install_missing: bool = False, timeout_s: float = 60.0) -> Cluster:
    """Start munged, slurmctld and slurmd under ``root``; return once the node is idle."""
    t0 = time.monotonic()
    if missing_binaries():
        if not install_missing:
            raise SlurmUnavailable(
                f"Slurm is not installed (missing: {', '.join(missing_binaries())}): "
                f"apt-get install -y {' '.join(PACKAGES)}, or pass --install"
            )
        install()
        if missing := missing_binaries():
            raise SlurmUnavailable(f"installed {' '.join(PACKAGES)} but still missing: {', '.join(missing)}")
    root = Path(root).resolve()
    stop(root)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    write_config(root, node=node, cpus=cpus)
    cluster = Cluster(root=root, node=node, cpus=cpus)
    munge = root / "munge"
    key = munge / "munge.key"
    if not key.exists():
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o400)
    munge.chmod(0o700)
    commands = {
        "munged": [
            _which("munged"),
            "--force",
            f"--key-file={key}",
            f"--socket={munge}/munge.socket",
            f"--pid-file={munge}/munged.pid",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
        ],
        # -c: a clean controller state (no jobs left from an earlier start); -i: ignore stale state errors
        "slurmctld": [_which("slurmctld"), "-c", "-i", "-f", str(cluster.conf)],
        "slurmd": [_which("slurmd"), "-f", str(cluster.conf), "-N", node],
    }
    for name, cmd in commands.items():
        proc = subprocess.run(cmd, env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            stop(root)
            raise SlurmUnavailable(f"{name} did not start ({proc.returncode}): {proc.stderr.strip()}\n{_logs(root)}")
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state = cluster.node_state()
        if state == "idle":
            cluster.setup_s = time.monotonic() - t0
            return cluster
        if state in ("down", "drained", "down*", "drained*"):
            cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        time.sleep(0.5)
    stop(root)
    raise SlurmUnavailable(f"node {node} not idle after {timeout_s:.0f} s (last state: {state})\n{_logs(root)}")


def _cancel_jobs(root: Path, timeout_s: float = 30.0) -> None:
    """Cancel every job of this cluster and wait until they are gone: a step still completing when the
    daemons stop keeps its slurmstepd alive forever, retrying to report through a munge that is gone."""
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}

    def jobs() -> list[str]:
        proc = subprocess.run(["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True, timeout=30)
        return proc.stdout.split() if proc.returncode == 0 else []

    if not (ids := jobs()):
        return
    subprocess.run(["scancel", "--full", *ids], env=env, capture_output=True, timeout=30)
    deadline = time.monotonic() + timeout_s
    while jobs() and time.monotonic() < deadline:
        time.sleep(0.5)


def _leftover_steps(root: Path) -> list[int]:
    """slurmstepd processes of this cluster (their sockets live in its spool folder) still running."""
    import psutil

    spool = str(root / "state" / "d")
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "slurmstepd":
            continue
        try:
            if any(str(c.laddr).startswith(spool) for c in proc.net_connections(kind="unix")):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def stop(root: Path = DEFAULT_DIR) -> list[str]:
    """Cancel the cluster's jobs, then stop the daemons started under ``root`` (by their pid files);
    returns the ones that were running."""
    root = Path(root).resolve()
    stopped = []
    if _alive(_pid(root / "slurmctld.pid")):
        _cancel_jobs(root)
    # the Slurm daemons together (each may take seconds), munged last: they authenticate through it
    for group in (
        (("slurmd", root / "slurmd.pid"), ("slurmctld", root / "slurmctld.pid")),
        (("munged", root / "munge" / "munged.pid"),),
    ):
        pids = {name: pid for name, pidfile in group if _alive(pid := _pid(pidfile))}
        for pid in pids.values():
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for name, pid in pids.items():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            stopped.append(name)
    for pid in _leftover_steps(root):  # only if a job outlived the wait above
        os.kill(pid, signal.SIGKILL)
        stopped.append(f"slurmstepd {pid}")
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"state, logs and config (default {DEFAULT_DIR})")
    parser.add_argument("--install", action="store_true", help=f"apt-get install {' '.join(PACKAGES)} if missing")
    args = parser.parse_args(argv)
    if args.action == "stop":
        print("stopped:", ", ".join(stop(args.dir)) or "nothing was running")
        return 0
    if args.action == "status":
        cluster = Cluster(root=args.dir.resolve(), node=socket.gethostname().split(".")[0], cpus=os.cpu_count() or 1)
        print(cluster.node_state() if cluster.conf.exists() else f"no cluster under {args.dir}")
        return 0
    try:
        cluster = start(args.dir, install_missing=args.install)
    except SlurmUnavailable as exc:
        print(f"slurm_cluster: {exc}")
        return 1
    print(
        f"one-node Slurm up in {cluster.setup_s:.1f} s: node {cluster.node} ({cluster.cpus} CPUs), partition {PARTITION}"
    )
    print(f"export SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
