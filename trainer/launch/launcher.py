"""Start the workers: in this process (torchrun, srun, or one process) or through torch's elastic agent.

``python train.py`` needs no torchrun: the launcher runs the same elastic agent torchrun runs
(``torch.distributed.launcher.api.elastic_launch``) with a c10d rendezvous on a free port, so every
job of a multirun gets its own worker group, port and store. Worker failures come back as
``WorkerFailure`` carrying the failing rank's own error, not the agent's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from parallel.foundation.layout import ParallelLayout
from trainer.launch.attempts import first_failure
from trainer.launch.environment import ExternalLaunch
from trainer.launch.loopback import local_only_env, local_rendezvous
from trainer.launch.preemption import forward_to_children, warning_signals
from trainer.observe.startup import StartClock

log = logging.getLogger("meshtrain.launch")


class Preempted(RuntimeError):
    """The job was asked to stop (SIGTERM or a time-limit warning signal) and saved a checkpoint first."""


class RendezvousFailure(RuntimeError):
    """The nodes of a multi-node job did not all meet at the rendezvous in time; one line, no trace."""


class WorkerFailure(RuntimeError):
    """A worker died; the message names the rank, its exit code and its error."""

    def __init__(self, message: str, *, rank: int | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code


def launch(
    cfg: DictConfig,
    cfg_dict: dict,
    *,
    layout: ParallelLayout,
    external: ExternalLaunch | None,
    run_dir: Path,
    run_meta: dict[str, Any],
) -> dict | None:
    """Run the job's workers; return rank 0's summary (None on other ranks/nodes)."""
    from trainer.launch import worker

    if external is not None:
        summary = worker.run(cfg_dict, run_dir, layout, run_meta, worker.DistEnv.from_environ())
    elif layout.world_size == 1 and layout.nnodes == 1:
        StartClock.from_meta(run_meta).say("starting the one rank in this process")
        env = worker.DistEnv(rank=0, local_rank=0, world_size=1, in_process=True)
        with local_only_env():  # gloo on loopback
            summary = worker.run(cfg_dict, run_dir, layout, run_meta, env)
    else:
        summary = _elastic(cfg, cfg_dict, layout=layout, run_dir=run_dir, run_meta=run_meta)
    if summary is not None and summary.get("status") == "preempted":
        raise Preempted(_preempted_message(run_dir))
    return summary


def _preempted_message(run_dir: Path) -> str:
    from trainer.checkpoint.files import checkpoints_root, complete_checkpoints

    found = complete_checkpoints(checkpoints_root(run_dir))
    where = f"checkpoint step {found[-1][0]} in {found[-1][1]}" if found else "no checkpoint could be written"
    return (
        f"preempted: {where}. Continue with the same command plus hydra.run.dir={run_dir} "
        "(trainer.resume=auto picks the newest checkpoint)"
    )


def _wait_for_master(addr: str, port: int, wait_s: float, *, node: int, nnodes: int) -> None:
    """Until node 0 listens on ``addr:port`` (plain TCP connects, so a node started first waits quietly
    instead of torch's store client logging a C++ trace per retry); then the rendezvous proper starts."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=2.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise RendezvousFailure(
                    f"node {node} of {nnodes}: node 0 did not open the rendezvous at {addr}:{port} within "
                    f"topology.rendezvous_timeout_s={wait_s}s. Start node 0 (topology.node_rank=0) with the same "
                    "topology.master_port, check topology.master_addr, or raise topology.rendezvous_timeout_s"
                ) from None
            time.sleep(0.5)


def _rendezvous(
    topo: Any, *, multi_node: bool, port: int, wait_s: int
) -> tuple[Any, dict[str, Any], contextlib.AbstractContextManager]:
    """The store this process serves for the rendezvous (None: the agent's), LaunchConfig's rendezvous arguments and
    the environment to start the workers in. Nodes meet at topology.master_addr:master_port, node 0 hosting; a single
    node's rendezvous is served on 127.0.0.1 by this process, so that nothing the job opens listens beyond the
    machine, its workers' environment pinned to loopback (loopback.py)."""
    if not multi_node:
        return local_rendezvous(port=port, timeout_s=wait_s)
    configs = {"is_host": int(topo.node_rank) == 0, "join_timeout": wait_s, "read_timeout": wait_s}
    return None, {"rdzv_endpoint": f"{topo.master_addr}:{port}", "rdzv_configs": configs}, contextlib.nullcontext()


def _elastic(cfg: DictConfig, cfg_dict: dict, *, layout: ParallelLayout, run_dir: Path, run_meta: dict) -> dict | None:
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from trainer.launch import worker
    from trainer.launch.rendezvous_events import name_events_cheaply

    name_events_cheaply()

    topo = cfg.topology
    clock = StartClock.from_meta(run_meta)
    start_method = _start_method(cfg, clock)
    nproc = layout.nproc_per_node
    multi_node = layout.nnodes > 1
    port = int(topo.master_port)
    wait_s = int(math.ceil(float(topo.rendezvous_timeout_s)))
    if multi_node:
        _announce_node(topo, nnodes=layout.nnodes, port=port, wait_s=wait_s)
    served, rdzv, workers_env = _rendezvous(topo, multi_node=multi_node, port=port, wait_s=wait_s)
    # all nodes of one job must agree on the run id; a single node gets a fresh one per job
    run_id = f"meshtrain-{topo.master_addr}-{port}" if multi_node else f"meshtrain-{uuid.uuid4().hex[:8]}"
    # rank 0 keeps the console (the rich progress bar); other local ranks write to files
    redirects = {i: Std.ALL for i in range(1, nproc)}
    config = LaunchConfig(
        min_nodes=layout.nnodes,
        max_nodes=layout.nnodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        **rdzv,
        max_restarts=int(topo.max_restarts),
        monitor_interval=0.1,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs" / "elastic"), redirects=redirects),
    )
    if multi_node and int(topo.node_rank) != 0:
        _wait_for_master(str(topo.master_addr), port, wait_s, node=int(topo.node_rank), nnodes=layout.nnodes)
    # the agent logs each failed worker's whole error file; ours is one line plus the rank's log
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # time-limit warnings (SIGUSR1, submitit's signal): the agent does not handle them, so pass them on
    previous = {sig: signal.signal(sig, lambda signum, frame: forward_to_children(signum)) for sig in warning_signals()}
    clock.say(f"starting {nproc} worker(s) on this node ({start_method})")
    try:
        meta = {**run_meta, "start_method": start_method}
        with workers_env:
            results = elastic_launch(config, worker.main)(cfg_dict, str(run_dir), layout, meta)
    except (RendezvousError, DistNetworkError, DistStoreError) as exc:
        if not multi_node:
            raise
        raise RendezvousFailure(
            f"node {topo.node_rank} of {layout.nnodes}: the other node(s) did not join the rendezvous at "
            f"{topo.master_addr}:{port} within topology.rendezvous_timeout_s={wait_s}s ({type(exc).__name__}). "
            "Start every node with the same topology.nnodes, master_addr and master_port and its own "
            "topology.node_rank, or raise topology.rendezvous_timeout_s"
        ) from None
    except SignalException as exc:
        # SIGTERM/SIGINT to this process: the agent passed it on to the workers, which checkpoint and stop
        raise Preempted(_preempted_message(run_dir) + f" (signal {signal.Signals(exc.sigval).name})") from None
    except ChildFailedError as exc:
        raise _worker_failure(exc, run_dir, node_ranks=range(nproc) if not multi_node else None) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        del served  # a single node's rendezvous store: it stops listening with its last reference
    # rank 0's summary: this node's only non-None result (the agent keys results by its own join order)
    return next((v for v in (results or {}).values() if v is not None), None)


def _start_method(cfg: DictConfig, clock: StartClock) -> str:
    """fork or spawn (``topology.start_method``); before forking, what the workers need is imported here."""
    from trainer.launch.start_method import prepare_start

    return prepare_start(cfg, say=clock.say)


def _announce_node(topo: DictConfig, *, nnodes: int, port: int, wait_s: int) -> None:
    node, others = int(topo.node_rank), [k for k in range(nnodes) if k != int(topo.node_rank)]
    role = f"serving the rendezvous on port {port}" if node == 0 else f"joining node 0 at {topo.master_addr}:{port}"
    log.warning(
        "node %d of %d: %s; waiting for node(s) %s (up to topology.rendezvous_timeout_s=%ss)",
        node,
        nnodes,
        role,
        ", ".join(map(str, others)),
        wait_s,
    )


def _worker_failure(exc: Exception, run_dir: Path, *, node_ranks: range | None) -> WorkerFailure:
    """The first failed worker of a ``ChildFailedError``: its rank, exit code and one-line message. On one node
    (``node_ranks``) the exit records say which rank failed first (``attempts.first_failure``), even one the agent
    stopped while it was still tearing down and so left out of ``exc.failures``; across nodes a record's rank is
    meshtrain's numbering, not the agent's."""
    rank, failure = exc.get_first_failure()
    message, exit_code = failure.message, failure.exitcode
    if isinstance(message, dict):
        message = message.get("message", str(message))
    if not message or message == "<N/A>":
        message = f"exited with code {exit_code} (signal or crash); see {run_dir}/logs/rank{rank}.log"
    record = first_failure(run_dir, node_ranks) if node_ranks is not None else None
    if record is not None and record["rank"] != rank:
        rank, message = record["rank"], record["error"]
        exit_code = exc.failures[rank].exitcode if rank in exc.failures else None
    code = f" (exit code {exit_code})" if exit_code is not None else ""
    return WorkerFailure(
        f"worker rank {rank} failed{code}: {message} (traceback in {run_dir}/logs/rank{rank}.log)",
        rank=rank,
        exit_code=exit_code,
    )
