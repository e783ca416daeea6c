"""One training process: process group → DeviceMesh → strategy engine → loop → teardown.

``main`` is the entry the elastic agent spawns (it must live in an importable module, not
``__main__``); ``run`` is also called directly when the process was started by torchrun or srun, or
for a one-process run. Teardown order matters: freeing a DDP module after the process group is gone
can hang the process forever (seen here 3 in 10 runs once pipelining was imported), so every model
reference is dropped and collected before ``destroy_process_group``.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from parallel.assembly.context import WorkerContext
from parallel.foundation.dims import coord_names
from parallel.foundation.layout import ParallelLayout
from parallel.foundation.state_bytes import local_bytes
from trainer.launch.attempts import previous_attempt_report, restart_count, write_exit_record
from trainer.launch.environment import rendezvous_port
from trainer.launch.host_memory import reuse_freed_host_memory
from trainer.launch.loopback import WORKER_STORE
from trainer.launch.preemption import EXIT_PREEMPTED, PreemptionFlag
from trainer.loop.fit import Trainer
from trainer.observe.files_sink import output_listing
from trainer.observe.rank_logs import TRACE_LOGGER_NAME, setup_rank_logging, teardown_rank_logging
from trainer.observe.sinks import build_sinks, finish_sinks
from trainer.observe.startup import StartClock
from trainer.typed.run_spec import run_spec


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    in_process: bool = False  # one process, no launcher: the group lives in a private HashStore

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        if "RANK" not in env and "SLURM_PROCID" in env:  # srun: translate Slurm's names
            env["RANK"] = env["SLURM_PROCID"]
            env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
            env["WORLD_SIZE"] = env["SLURM_NTASKS"]
            env.setdefault("MASTER_ADDR", env.get("SLURM_LAUNCH_NODE_IPADDR", "localhost"))
            env.setdefault("MASTER_PORT", str(rendezvous_port(env.get("SLURM_JOB_ID", "0"))))
        if "RANK" not in env and "SUBMITIT_LOCAL_GLOBALID" in env:  # submitit's local executor
            env["RANK"] = env["SUBMITIT_LOCAL_GLOBALID"]
            env["LOCAL_RANK"] = env.get("SUBMITIT_LOCAL_LOCALID", "0")
            env["WORLD_SIZE"] = env["SUBMITIT_LOCAL_NTASKS"]
            env.setdefault("MASTER_ADDR", "localhost")
            env.setdefault("MASTER_PORT", str(rendezvous_port(env.get("SUBMITIT_LOCAL_JOB_ID", "0"))))
        return cls(rank=int(env["RANK"]), local_rank=int(env.get("LOCAL_RANK", "0")), world_size=int(env["WORLD_SIZE"]))

    def by_node_rank(self, *, node_rank: int, nproc_per_node: int) -> DistEnv:
        """Global ranks ordered by ``topology.node_rank``: the c10d rendezvous numbers nodes in the order
        they join, so without this global rank 0 (console, metrics, summary, W&B) may land on any node."""
        rank = node_rank * nproc_per_node + self.local_rank
        os.environ["RANK"] = str(rank)
        os.environ["GROUP_RANK"] = str(node_rank)
        return DistEnv(rank=rank, local_rank=self.local_rank, world_size=self.world_size)


def _store(env: DistEnv, timeout: timedelta) -> dist.Store:
    """The process group's store, with a prefix per elastic attempt.

    After an elastic restart the agent's store still holds the previous attempt's keys; the default
    group copes, but DeviceMesh's sub-groups then read dead peers' addresses ("connectFullMesh failed
    ... Connection refused", seen here). A per-attempt prefix gives each attempt a clean namespace.
    """
    if env.in_process:
        return dist.HashStore()
    served = os.environ.get(WORKER_STORE)
    if served:  # a single-node job: the launcher's own store, served on loopback (trainer/launch/loopback.py)
        host, port = served.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), env.world_size, is_master=False, timeout=timeout, multi_tenant=True)
        return dist.PrefixStore(f"meshtrain/attempt{restart_count()}", store)
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ.get("MASTER_ADDR", "localhost"),
        int(os.environ["MASTER_PORT"]),
        env.world_size,
        is_master=not agent_hosts and env.rank == 0,
        timeout=timeout,
        multi_tenant=True,
    )
    return dist.PrefixStore(f"meshtrain/attempt{restart_count()}", store)


class SharedFolderError(RuntimeError):
    """Nodes do not share the run folder, and the run asks for checkpoints (which need one folder)."""


PROBE = ".meshtrain-shared-probe"


def nodes_without_run_dir(run_dir: Path, *, rank: int, world_size: int, nproc_per_node: int) -> list[int]:
    """Collective: rank 0 writes a probe file with a fresh token into its run folder; every rank looks for
    it in its own. Returns the nodes that do not see it (their run folder is not node 0's)."""
    token = [f"{os.getpid()}-{time.time_ns()}" if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe = run_dir / PROBE
    if rank == 0:
        probe.write_text(token[0])
    dist.barrier()
    try:
        sees = probe.read_text() == token[0]
    except OSError:
        sees = False
    seen: list = [None] * world_size
    dist.all_gather_object(seen, sees)
    if rank == 0:
        probe.unlink(missing_ok=True)
    return sorted({r // nproc_per_node for r, ok in enumerate(seen) if not ok})


@dataclass
class TrainerContext(WorkerContext):
    """A worker's context as the trainer holds it: the typed run for ``parallel/`` (``trainer/typed/run_spec.py``), and the
    config its own parts (the loop, the sinks, the checkpointer) read."""

    cfg: Any = None
    clock: StartClock = field(default_factory=lambda: StartClock(time.time()))
    """The command's start-up clock (``trainer/observe/startup.py``): the stage lines and time_to_first_step_s."""


def data_sampler(cfg: Any) -> Callable[[int], tuple[Any, Any]]:
    """The first ``rows`` rows of the run's first global batch (the data built as the loop builds it), for
    ``pp.split=balanced``."""

    def sample(rows: int) -> tuple[Any, Any]:
        data = instantiate(cfg.data, seed=int(cfg.trainer.seed))
        inputs, targets = data.global_batch(1)
        return inputs[:rows], targets[:rows]

    return sample


def mesh_place(layout: ParallelLayout, rank: int) -> str:
    """Where a rank sits, every dimension named once: ``mesh pp 0/1, dp 1/2, cp 0/1, tp 0/1; ep 0/1 (borrowed)``."""
    coords = layout.coords(rank)
    world = [f"{n} {coords[n]}/{layout.size(n)}" for n in layout.mesh_dim_names]
    borrowed = [f"{n} {c}/{layout.size(n)}" for n, c in coords.items() if n not in layout.mesh_dim_names]
    return "mesh " + ", ".join(world) + (f"; {', '.join(borrowed)} (borrowed)" if borrowed else "")


def layout_label(layout: ParallelLayout) -> str:
    """``hybrid: pp2 x dp2 x tp2 on 8 ranks``: the strategy and its degrees above 1, in mesh order."""
    sizes = [f"{n}{layout.size(n)}" for n in coord_names() if layout.size(n) > 1]
    return (
        f"{layout.strategy}: {' x '.join(sizes)} on {layout.world_size} ranks"
        if sizes
        else f"{layout.strategy}: one rank"
    )


def check_shared_run_dir(cfg, run_dir: Path, layout: ParallelLayout, env: DistEnv, log: logging.Logger) -> None:
    blind = nodes_without_run_dir(
        run_dir, rank=env.rank, world_size=env.world_size, nproc_per_node=layout.nproc_per_node
    )
    if not blind:
        return
    where = f"node(s) {', '.join(map(str, blind))} do not see node 0's run folder ({run_dir} on node 0)"
    if int(cfg.trainer.checkpoint_every) > 0:
        raise SharedFolderError(
            f"{where}: a checkpoint needs every node's shards in one folder. Give every node the same "
            "shared folder (hydra.run.dir=<a path all nodes mount>), or set trainer.checkpoint_every=0"
        )
    if env.rank == 0:
        log.warning("%s: node 0 keeps the metrics, summary and W&B run; the other nodes write only their logs", where)


def pick_device(cfg, local_rank: int) -> torch.device:
    want = cfg.topology.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("topology.device=cuda but torch sees no CUDA device; use topology.device=cpu")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def pick_backend(cfg, device: torch.device) -> str:
    if cfg.topology.backend != "auto":
        return str(cfg.topology.backend)
    return "nccl" if device.type == "cuda" else "gloo"


@record
def main(cfg_dict: dict, run_dir: str, layout: ParallelLayout, run_meta: dict[str, Any]) -> dict | None:
    """Elastic agent entry point; ``@record`` sends this worker's traceback to the launcher."""
    env = DistEnv.from_environ()
    if layout.nnodes > 1:
        env = env.by_node_rank(node_rank=int(cfg_dict["topology"]["node_rank"]), nproc_per_node=layout.nproc_per_node)
    preemption = PreemptionFlag(grace_s=float(cfg_dict["trainer"]["stop_grace_s"]))
    summary = run(cfg_dict, Path(run_dir), layout, run_meta, env, preemption=preemption)
    if "SIGTERM" in preemption.received:
        # SIGTERM reaches a worker when the agent shuts the group down (it was signalled too). The agent then waits
        # up to 30 s for each worker to exit, while a worker that returns waits for the agent's "finished" event,
        # which a shutdown never sets: measured, every preemption ended 30 s after the checkpoint was saved. The
        # checkpoint and summary.json are written; leave now.
        logging.shutdown()
        os._exit(EXIT_PREEMPTED)
    return summary


def run(
    cfg_dict: dict,
    run_dir: Path,
    layout: ParallelLayout,
    run_meta: dict[str, Any],
    env: DistEnv,
    *,
    preemption: PreemptionFlag | None = None,
) -> dict | None:
    gc.freeze()  # the imports (and a forked worker's inherited objects) live as long as the run: _teardown says why
    cfg = OmegaConf.create(cfg_dict)
    torch.set_num_threads(int(cfg.topology.threads_per_rank))
    host_memory = reuse_freed_host_memory() if cfg.topology.reuse_host_memory else None  # before the model's memory
    log, handlers = setup_rank_logging(run_dir, env.rank, hydra_logging=run_meta.get("logging"))
    trainer = engine = sinks = summary = error = None
    exit_code = 1
    preemption = (preemption or PreemptionFlag(grace_s=float(cfg.trainer.stop_grace_s))).install()
    try:
        device, backend = _join_group(cfg, env)
        if layout.nnodes > 1:
            check_shared_run_dir(cfg, run_dir, layout, env, log)
        ctx = _context(cfg, layout, env, device=device, run_dir=run_dir, run_meta=run_meta, log=log)
        clock = ctx.clock
        started = run_meta.get("start_method") or ("in-process" if env.in_process else "by torchrun / srun")
        log.info(
            clock.line(
                f"rank {env.rank}/{env.world_size} on {device} ({backend}), {mesh_place(layout, env.rank)}, "
                f"started: {started}"
            )
        )
        if host_memory is not None:
            log.info(clock.line(host_memory))
        log.debug("rank %d: layout %s", env.rank, layout.to_dict())
        log.debug("rank %d: config %s", env.rank, cfg_dict)
        if env.rank == 0 and (report := previous_attempt_report(run_dir, env.world_size)):
            log.warning(report)
        strategy = instantiate(cfg.parallel)
        log.info(
            clock.line(
                f"building the model ({cfg.model.get('name')}) and composing the layout ({layout_label(layout)})"
            )
        )
        engine = strategy.build(ctx=ctx)
        ctx.model_init.update(local_param_bytes=local_bytes(engine.parameters(), materialised=True))
        log.info(clock.line(f"model built ({cfg.model.get('name')}): {ctx.model_init}"))
        trainer = Trainer(ctx=ctx, engine=engine)
        start_step = trainer.resume()
        if start_step and env.rank == 0:
            log.info("continuing at step %d of %d", start_step + 1, cfg.trainer.max_steps)
        log.info(clock.line(f"first step ({start_step + 1} of {cfg.trainer.max_steps}) running"))
        if env.rank == 0:
            sinks = build_sinks(ctx=ctx, cfg_dict=cfg_dict, run_meta=run_meta, start_step=start_step)
        summary = trainer.fit(sinks=sinks, start_step=start_step, preemption=preemption)
        summary["restarts"] = restart_count()
        if summary["status"] == "preempted":  # which signal stopped it: the Slurm launcher's requeue reads it
            summary["stop_signals"] = list(preemption.received)
        exit_code = 0  # rank 0's console says the run's end line (ConsoleSink.log_summary)
        return summary if env.rank == 0 else None
    except BaseException as exc:
        error = exc
        log.error("rank %d failed: %s: %s", env.rank, type(exc).__name__, exc)
        logging.getLogger(TRACE_LOGGER_NAME).exception("rank %d traceback", env.rank)
        raise
    finally:
        write_exit_record(run_dir, env.rank, error=error)  # before uninstall: the agent's SIGTERM would end us
        preemption.uninstall()
        if sinks is not None:
            finish_sinks(sinks, summary, exit_code=exit_code, log=log)
            if summary is not None:  # the listing now includes summary.json
                log.info(output_listing(run_dir))
        if engine is not None:
            engine.close()
        trainer = engine = None
        _teardown(handlers)


def _join_group(cfg: DictConfig, env: DistEnv) -> tuple[torch.device, str]:
    """This rank's device and backend, and the process group joined on them."""
    device = pick_device(cfg, env.local_rank)
    backend = pick_backend(cfg, device)
    timeout = timedelta(seconds=float(cfg.topology.timeout_s))
    dist.init_process_group(
        backend,
        store=_store(env, timeout),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    return device, backend


def _context(
    cfg: DictConfig,
    layout: ParallelLayout,
    env: DistEnv,
    *,
    device: torch.device,
    run_dir: Path,
    run_meta: dict[str, Any],
    log: logging.Logger,
) -> TrainerContext:
    """The rank's context: the typed run, the device mesh, the data sampler, the start clock."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names)
    return TrainerContext(
        run=run_spec(cfg, layout),
        cfg=cfg,
        clock=StartClock.from_meta(run_meta),
        sample_batch=data_sampler(cfg),
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        device=device,
        mesh=mesh,
        run_dir=run_dir,
        log=log,
    )


def _teardown(handlers: Any) -> None:
    """Model references are gone (the caller dropped them): collect them before the process group goes, then
    the group, then the rank's log handlers (freeing DDP after its group is gone can hang). The collection leaves
    out what ``run`` froze at its start: the imports (torch, transformers, Hydra: about 330,000 objects), whose
    traversal made this one collection 0.22 s of CPU per rank in a two-step ddp run, a third of a worker's CPU
    (process time around it, cold ``python train.py``); under 0.01 s frozen. Unfrozen after, so a process that
    goes on (an in-process job of a sweep) collects as before."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    teardown_rank_logging(handlers)
    gc.unfreeze()
