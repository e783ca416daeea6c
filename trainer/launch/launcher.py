"""Start the workers: in this process (torchrun, srun, or one process) or through torch's elastic agent.

``python train.py`` needs no torchrun: the launcher runs the same elastic agent torchrun runs
(``torch.distributed.launcher.api.elastic_launch``) with a c10d rendezvous on a free port, so every
job of a multirun gets its own worker group, port and store. Worker failures come back as
``WorkerFailure`` carrying the failing rank's own error, not the agent's.
"""

from __future__ import annotations

import logging
import signal
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from parallel.core.layout import ParallelLayout
from trainer.launch.environment import ExternalLaunch
from trainer.launch.preemption import forward_to_children, warning_signals

log = logging.getLogger("meshtrain.launch")


class Preempted(RuntimeError):
    """The job was asked to stop (SIGTERM or a time-limit warning signal) and saved a checkpoint first."""


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
        env = worker.DistEnv(rank=0, local_rank=0, world_size=1, in_process=True)
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


def _elastic(cfg: DictConfig, cfg_dict: dict, *, layout: ParallelLayout, run_dir: Path, run_meta: dict) -> dict | None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from trainer.launch import worker

    topo = cfg.topology
    nproc = layout.nproc_per_node
    multi_node = layout.nnodes > 1
    port = int(topo.master_port)
    endpoint = f"{topo.master_addr}:{port}" if (multi_node or port) else "localhost:0"
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
        rdzv_endpoint=endpoint,
        rdzv_configs={"is_host": int(topo.node_rank) == 0} if multi_node else {},
        max_restarts=int(topo.max_restarts),
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs" / "elastic"), redirects=redirects),
    )
    # the agent logs each failed worker's whole error file; ours is one line plus the rank's log
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # time-limit warnings (SIGUSR1, submitit's signal): the agent does not handle them, so pass them on
    previous = {sig: signal.signal(sig, lambda signum, frame: forward_to_children(signum)) for sig in warning_signals()}
    try:
        results = elastic_launch(config, worker.main)(cfg_dict, str(run_dir), layout, run_meta)
    except SignalException as exc:
        # SIGTERM/SIGINT to this process: the agent passed it on to the workers, which checkpoint and stop
        raise Preempted(_preempted_message(run_dir) + f" (signal {signal.Signals(exc.sigval).name})") from None
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", str(message))
        if not message or message == "<N/A>":
            message = f"exited with code {failure.exitcode} (signal or crash); see {run_dir}/logs/rank{rank}.log"
        raise WorkerFailure(
            f"worker rank {rank} failed (exit code {failure.exitcode}): {message} "
            f"(traceback in {run_dir}/logs/rank{rank}.log)",
            rank=rank,
            exit_code=failure.exitcode,
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return results.get(0) if results else None
