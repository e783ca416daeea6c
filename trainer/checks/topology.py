"""``topology.*``: the device and backend, and the contradictions a multi-node rendezvous would otherwise turn into
a hang or a C++ trace. ``topology.backend`` and ``topology.device`` are enum-typed by the schema
(parallel/config.py). No torch import."""

from __future__ import annotations

import os
import socket

from omegaconf import DictConfig

from parallel.foundation.layout import ParallelLayout
from trainer.checks.findings import Findings


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_backend(cfg: DictConfig, layout: object, f: Findings) -> None:
    if cfg.topology.backend == "nccl" and cfg.topology.device == "cpu":
        f.error("topology.backend=nccl with topology.device=cpu: NCCL needs CUDA; use topology.backend=gloo")
    if cfg.dp.sync_batchnorm and cfg.topology.device == "cpu":
        f.error(
            "dp.sync_batchnorm=true with topology.device=cpu: torch's SyncBatchNorm runs on CUDA only; "
            "on CPU raise data.global_batch_size so each rank sees >= 8 samples instead"
        )


def check_topology(cfg: DictConfig, layout: object, f: Findings) -> None:
    topo = cfg.topology
    f.require("topology.max_restarts", topo.max_restarts, int(topo.max_restarts) >= 0, "must be >= 0")
    port = int(topo.master_port)
    f.require("topology.master_port", port, 0 <= port <= 65535, "must be a TCP port in 0..65535 (0 picks a free one)")
    timeout = topo.get("rendezvous_timeout_s")
    if timeout is not None:
        f.require("topology.rendezvous_timeout_s", timeout, float(timeout) > 0, "must be > 0 seconds")
    if f.external is not None:
        return  # torchrun / Slurm chose ranks and addresses
    nnodes, node_rank = int(topo.nnodes), int(topo.node_rank)
    if not 0 <= node_rank < max(1, nnodes):
        f.error(
            f"topology.node_rank={node_rank} with topology.nnodes={nnodes}: node ranks run 0..{max(1, nnodes) - 1}; "
            f"start each node with its own topology.node_rank in that range"
        )
        return
    if nnodes <= 1:
        return
    addr = str(topo.master_addr)
    try:
        socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError):
        f.error(
            f"topology.master_addr={addr}: this host name does not resolve here; give node 0's host name or IP "
            "address as every node sees it"
        )
        return
    if port == 0:
        f.error("topology.master_port=0 with topology.nnodes>1: every node must know the port; set one, e.g. 29500")
    elif node_rank == 0 and port_in_use("", port):
        f.error(
            f"topology.master_port={port}: the port is in use on this host (node 0 serves the rendezvous there); "
            "choose a free port and give the same one to every node"
        )


def cpu_cores() -> int:
    """The cores this process may run on (its affinity, as under a container's or Slurm's limit; else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def check_cores(cfg: DictConfig, layout: ParallelLayout, f: Findings) -> None:
    """A warning (the run goes on) when this node's CPU ranks outnumber its cores: ``dp.size=8`` on 2 cores runs, but
    the ranks take turns on the cores, so its steps time the machine's crowding rather than the layout."""
    if f.external is not None or str(cfg.topology.device) == "cuda":
        return
    if str(cfg.topology.device) == "auto" and str(cfg.topology.backend) == "nccl":
        return
    ranks, cores = layout.nproc_per_node, cpu_cores()
    if ranks > cores:
        f.warn(
            f"{ranks} ranks on this node and {cores} CPU core(s): the ranks take turns on the cores, so each step "
            f"takes longer than the layout needs and its timings (tokens/s, comm and bubble shares) measure the "
            f"crowding. Fine for trying a layout; for numbers, use at most {cores} ranks per node"
        )
