"""``topology.calibrate=true``: measure this machine instead of trusting the preset (a few seconds).

The measurements, each fitted to the cost model's own formula so that the planner's terms mean what
was measured:
- compute: forward + backward of the configured model (its family's builder, ``ModelSpec.resized``: a 2-block
  proxy of a model too big to build) at two micro-batch sizes; t = overhead + FLOPs / (FLOP/s) gives sustained FLOP/s and the fixed cost of one
  micro-batch (``microbatch_overhead_ms``);
- optimizer: AdamW (as the trainer builds it: fused kernels) step + gradient clipping, as bytes moved per second
  (``memory_gbps``);
- all-reduce: two gloo processes, two buffer sizes; t = 2α + bytes/β (ring with n = 2);
- point-to-point: ping-pong between the same two processes; t = α + bytes/β one way;
- four fixed costs the FLOPs and the links do not explain, each from a whole training step (forward,
  backward, clipping, AdamW) of the configured model (or its proxy) run by the two processes as meshtrain runs
  it: DDP with torch's default buckets and no comm hook, as the trainer runs it (``ddp_bucket_us``: the reducer's hooks and bucket
  copies, and the all-reduce left exposed after the backward while gloo's thread competes with the other
  rank's compute), GPipe over two stages with 4 micro-batches (``pipeline_action_ms``: the schedule's bookkeeping,
  posting send/recv, waking the peer), the family's TP plan (``tp_collective_us``: DTensor's dispatch of the
  sharded ops and optimizer, each rank waiting for the other at every collective) and FSDP2 with each block
  and the root a unit (``fsdp_collective_us``: its hooks and copies, the sharded optimizer). The cost model's
  step is linear in each of them, so each is solved from it: measured = step(cost 0) + cost x (how often the
  model charges it). The same steps' process CPU time (all the rank's threads) gives each cost's CPU share: the
  CPU seconds beyond the model's computing and AdamW over the seconds the cost explains (``fixed_cost_cpu_share``:
  the rest is waiting for the peer, which ranks sharing cores overlap with each other's work). Tiny benchmarks
  did not reproduce the costs: a pair of 16-feature TP layers gave 0-7 ms per collective run to run where
  gpt_small's TP step spent 6.4 ms per collective in ``wait_tensor`` alone, and a 16-feature pipeline's
  0.6-1.4 ms per action left gpt_small's pipelines 15-60% under-predicted;
- a busy node: the same forward + backward run by both processes at once, over the time of one of them
  alone in the same rounds (``busy_node_slowdown``): ranks of one node share memory bandwidth and caches (and on a CPU, the
  cores' turbo budget), so a rank computes slower when its neighbours compute too. On 2 cores here
  this was 1.3-1.5x on an earlier day (1.0-1.39 on 2026-12-03), the largest error of a cost model that
  assumed independent devices.

Every timing (forward+backward, links, busy and fixed-cost steps) is taken in interleaved rounds, keeping
the median of each one's round medians (``_median_of_rounds``): a fixed cost is a difference of measured times, and one
noisy window of a few seconds doubled it (docs/planner.md, Calibration).
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from models.registry import model_shape
from parallel.plan.cost_model import Candidate, estimate
from parallel.plan.specs import HardwareSpec, Link, PlanError, Workload

MAX_BUILD_PARAMS = 50_000_000
COMM_SIZES = (64 * 1024, 4 * 2**20)
COMM_REPS = 15
PIPE_MICRO_BATCHES = 4
STEP_ROUNDS = 3
STEP_REPS = 5


def _timed(
    fn: Callable[[], None],
    *,
    min_time: float = 0.15,
    min_reps: int = 5,
    reps: int | None = None,
    warmup: int = 2,
) -> float:
    """Median of the timed calls after ``warmup`` calls: what a training step will typically see (the
    minimum flatters the machine: training runs long enough to meet its slow moments too).

    ``reps`` fixes the number of calls: a collective must be called equally often on every rank, and a
    count decided by each rank's own clock deadlocks (seen here: one rank stopped, the other waited)."""
    return _timed_wall_cpu(fn, min_time=min_time, min_reps=min_reps, reps=reps, warmup=warmup)[0]


def _timed_wall_cpu(
    fn: Callable[[], None], *, min_time: float = 0.15, min_reps: int = 5, reps: int | None = None, warmup: int = 2
) -> tuple[float, float]:
    """``_timed``'s median wall time, and the median CPU time of the same calls: the process's, all its
    threads (a collective backend's included), which is what the call takes from cores other ranks share."""
    for _ in range(warmup):
        fn()
    times, cpu, start = [], [], time.perf_counter()
    while (
        (len(times) < reps) if reps is not None else (len(times) < min_reps or time.perf_counter() - start < min_time)
    ):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if len(times) >= 50:
            break
    return sorted(times)[len(times) // 2], sorted(cpu)[len(cpu) // 2]


def _median_of_rounds(
    steps: dict[str, Callable[[], None]],
    *,
    rounds: int = STEP_ROUNDS,
    reps: int = STEP_REPS,
    sync: Callable[[], None] = lambda: None,
    cpu: bool = False,
) -> dict[str, float]:
    """Each step's median over ``reps`` calls, in ``rounds`` rounds that take the steps in turn; per step the
    median of the round medians. This VM has noisy phases lasting seconds (one calibration measured the same TP
    step at 0.36-0.60 s, the next at 0.15-0.24 s): one window of consecutive calls can fall wholly inside one and
    double a fixed cost solved from it, while interleaved rounds put each step in several windows and the
    median drops the one that did. Not the lowest round: a training run's median step meets the machine's
    ordinary interference too, and the lowest round under-predicted every 2-rank layout of
    ``benchmarks/planner.py`` by 13-24%. ``sync`` (a barrier) before each window: with several processes,
    every rank runs the same steps in the same order, so their collectives match. ``cpu``: also each step's
    process CPU time per call, the same way, as ``cpu_<name>``."""
    for step in steps.values():
        step(), step()
    medians: dict[str, list[float]] = {name: [] for name in steps}
    medians.update({f"cpu_{name}": [] for name in steps} if cpu else {})
    for _ in range(rounds):
        for name, step in steps.items():
            sync()
            wall, used = _timed_wall_cpu(step, reps=reps, warmup=0)
            medians[name].append(wall)
            if cpu:
                medians[f"cpu_{name}"].append(used)
    return {name: statistics.median(m) for name, m in medians.items()}


def _fit_line(x1: float, t1: float, x2: float, t2: float) -> tuple[float, float]:
    """(intercept, slope) through two points, both kept non-negative."""
    slope = max((t2 - t1) / (x2 - x1), 1e-15)
    return max(t1 - slope * x1, 0.0), slope


def family_kwargs(model_config: Any, sizes: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """(the configured family's ``models.spec.ModelSpec``, builder kwargs of its model with ``sizes`` replaced):
    the calibration and the dry run build the family that will train, not a stand-in. A family without
    ``ModelSpec.resized`` is built at its configured sizes only (its config holds the builder's kwargs).
    ``model_config``: the model's typed config (``ModelSpec.typed``) or its plain values."""
    from models.registry import spec_for
    from models.spec import builder_kwargs

    family = spec_for(model_config)
    if family.resized is None and sizes:
        raise PlanError(
            f"model.family={family.family}: the planner's calibration builds a small model of the configured family "
            f"({', '.join(f'{k}={v}' for k, v in sizes.items())}), and its ModelSpec has no `resized` (builder kwargs "
            "for given sizes); plan without topology.calibrate=true, or give the ModelSpec a resized function "
            "(docs/models.md)"
        )
    if family.resized is None:
        return family, {k: v for k, v in builder_kwargs(model_config).items() if k != "_target_"}
    return family, family.resized(model_config, sizes)


def build_family(family: Any, kwargs: dict[str, Any]) -> Any:
    """The family's module (``ModelSpec.build``) from builder ``kwargs``, seeded so both processes hold the same
    weights."""
    import torch

    torch.manual_seed(0)
    return family.build(kwargs)


def _lm_step(model: Any, x: Any, loss: Callable[[Any, Any], Any]) -> Callable[[], None]:
    """One forward + backward of ``model`` on the next-token loss of ``x`` itself."""

    def run() -> None:
        model.zero_grad(set_to_none=True)
        loss(model(x), x).backward()

    return run


BUSY_BATCH = 8
#: the most rows the compute line is measured at (a layout's micro-batch on one rank ranges from 1 row to the
#: global batch: per-row time grows with the batch on a CPU, 50.7 ms at 16 rows against 47 ms extrapolated from
#: 1 and 8 rows for gpt_small at 64 tokens, so the line is drawn through the ends of that range)
COMPUTE_MAX_ROWS = 32


def measure_compute(model_config: Any, *, seq_len: int, threads: int, max_rows: int = BUSY_BATCH) -> dict[str, Any]:
    """FLOP/s and per-micro-batch overhead: a line through a forward + backward of 1 row and of ``max_rows``
    (at least BUSY_BATCH, at most COMPUTE_MAX_ROWS); AdamW's bytes per second."""
    import torch

    from models.spec import config_values
    from parallel.foundation.optimizer import build_optimizer_over

    torch.set_num_threads(threads)
    spec = model_shape(model_config)
    sizes = {"max_seq_len": max(spec.max_seq_len, seq_len)}
    proxy = spec.params > MAX_BUILD_PARAMS
    if proxy:  # same width, two blocks, shorter rows: the FLOP rate of big matmuls, not the model's memory
        sizes.update(n_layers=2, vocab_size=min(spec.vocab_size, 4096))
        seq_len = min(seq_len, 256)
    family, kwargs = family_kwargs(model_config, sizes)
    model = build_family(family, kwargs)
    built = family.typed(kwargs)
    measured = replace(family.shape(built), name="calib")
    flops_per_token = measured.training_flops_per_token(seq_len)
    loss = family.loss_fn()

    def step(b: int) -> Callable[[], None]:
        return _lm_step(model, torch.randint(0, measured.vocab_size, (b, seq_len)), loss)

    b1, b2 = 1, min(max(BUSY_BATCH, max_rows), COMPUTE_MAX_ROWS)
    t = _median_of_rounds({"t1": step(b1), "t2": step(b2)})
    t1, t2 = t["t1"], t["t2"]
    overhead, s_per_flop = _fit_line(b1 * seq_len * flops_per_token, t1, b2 * seq_len * flops_per_token, t2)
    proxy_overhead = overhead
    if proxy:
        overhead *= (spec.n_layers + 2) / (measured.n_layers + 2)

    opt = build_optimizer_over(functools.partial(torch.optim.AdamW, lr=1e-4), model.parameters())
    step(b1)()

    def optimizer_step() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    t_opt = _timed(optimizer_step)
    n_params = sum(p.numel() for p in model.parameters())
    pipelined = family.pipeline is not None and measured.n_layers >= 2
    tp_ok = family.parallelize is not None and not family.tp_problems(built, 2)
    fixed = (["pipeline_action_s"] if pipelined else []) + (["tp_collective_s"] if tp_ok else [])
    return {
        "shape": measured,
        "proxy_overhead_s": proxy_overhead,
        "fixed_costs": ["ddp_bucket_s", *fixed, "fsdp_collective_s"],
        "flops": 1.0 / s_per_flop,
        "microbatch_overhead_s": overhead,
        "memory_bytes_per_s": n_params * (2 * 4 + 2 * 4 + 2 * 8) / t_opt,
        "model_values": config_values(model_config),  # plain values: the link workers rebuild the family
        "sizes": sizes,
        "seq_len": seq_len,
    }


def _comm_worker(rank: int, port: int, out_path: str, sizes: tuple[int, ...], busy: dict[str, Any] | None) -> None:
    import gc

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results: dict[str, float] = {}
    links: dict[str, Callable[[], None]] = {}
    for n in sizes:
        buf = torch.ones(n // 4)

        def allreduce(buf: torch.Tensor = buf) -> None:
            dist.all_reduce(buf)

        def pingpong(buf: torch.Tensor = buf) -> None:
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)

        links[f"allreduce_{n}"], links[f"pingpong_{n}"] = allreduce, pingpong
    timed = _median_of_rounds(links, reps=COMM_REPS, sync=dist.barrier)
    for n in sizes:
        results[f"allreduce_{n}"] = timed[f"allreduce_{n}"]
        results[f"p2p_{n}"] = timed[f"pingpong_{n}"] / 2  # a round trip is two messages
    if busy is not None:
        family, kwargs = family_kwargs(busy["model_values"], busy["sizes"])
        loss, seq_len = family.loss_fn(), busy["seq_len"]
        torch.manual_seed(0)  # the same rows on both processes (the pipeline's last stage takes them as targets)
        x = torch.randint(0, int(kwargs["vocab_size"]), (BUSY_BATCH, seq_len))
        builders = {
            "ddp_bucket_s": lambda: _ddp_step(build_family(family, kwargs), x, loss),
            "pipeline_action_s": lambda: _pipeline_step(family, kwargs, loss, x.repeat(2, 1), rank),
            "tp_collective_s": lambda: _tensor_parallel_step(family, kwargs, loss, x),
            "fsdp_collective_s": lambda: _fully_sharded_step(family, kwargs, loss, x),
        }
        # rank 0 computes alone (rank 1 waits at the next barrier), then both at once, as the ranks of one node
        # do: the busy ratio from the same rounds (timed minutes apart, a noisy moment in one skewed it 2.8x)
        fb = _lm_step(build_family(family, kwargs), x, loss)
        steps = {"alone_s": fb if rank == 0 else lambda: None, "busy_s": fb}
        steps.update({f"step_{name}": builders[name]() for name in busy["fixed_costs"]})  # same list on both ranks
        results.update(_median_of_rounds(steps, sync=dist.barrier, cpu=True))
        del steps, builders
        gc.collect()  # free the DDP module before the group goes: freeing it later can hang (docs/stack.md)
    if rank == 0:
        import json

        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _ddp_step(model: Any, x: Any, loss: Callable[[Any, Any], Any]) -> Callable[[], None]:
    """One training step of ``model`` under DDP as ``parallel=ddp`` builds it (torch's default buckets, DDP's own C++
    all-reduce: the trainer reads DDP's timer on logged steps only) over the two processes: forward, backward
    with the bucket all-reduce, clipping, AdamW."""
    from torch.nn.parallel import DistributedDataParallel

    return _next_token_step(DistributedDataParallel(model), x, loss)


def _pipeline_step(
    family: Any, kwargs: dict[str, Any], loss: Callable[[Any, Any], Any], x: Any, rank: int
) -> Callable[[], None]:
    """One training step of the model built from ``kwargs`` as a two-stage GPipe pipeline cut as the trainer
    cuts it (the first half of the blocks with the parts before them on rank 0, the rest with the parts after
    them on rank 1): the rows of ``x`` in PIPE_MICRO_BATCHES micro-batches, then clipping and AdamW on each
    stage's parameters."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from parallel.pipeline.stages import build_stage_module, pipeline_parts, stage_specs

    model = build_family(family, kwargs)
    n_blocks = len(pipeline_parts(model, family.pipeline)[1])
    stage_spec = stage_specs(n_blocks=n_blocks, split_points=[n_blocks // 2], stage_ranks=[0, 1])[rank]
    model = build_stage_module(model, spec=stage_spec, units=family.pipeline)
    stage = PipelineStage(model, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=PIPE_MICRO_BATCHES, loss_fn=loss)

    def forward_backward() -> None:
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=x, losses=[])

    return _training_step(list(model.parameters()), forward_backward, pp_group=dist.group.WORLD)


def _training_step(
    params: list[Any], forward_backward: Callable[[], None], *, pp_group: Any = None
) -> Callable[[], None]:
    """``forward_backward``, then clipping (over ``pp_group`` for a pipeline stage) and AdamW, built as the
    trainer builds it by default (``build_optimizer_over``: grouped by kind, fused kernels)."""
    import torch

    from parallel.foundation.grad_clip import clip_grad_norm_
    from parallel.foundation.optimizer import build_optimizer_over

    opt = build_optimizer_over(functools.partial(torch.optim.AdamW, lr=1e-4), params)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward_backward()
        clip_grad_norm_(params, 1.0, pp_group=pp_group)
        opt.step()

    return step


def _next_token_step(model: Any, x: Any, loss: Callable[[Any, Any], Any]) -> Callable[[], None]:
    """A training step of a sharded or local model on the next-token loss of ``x`` itself."""

    def forward_backward() -> None:
        loss(model(x), x).backward()

    return _training_step(list(model.parameters()), forward_backward)


def _tensor_parallel_step(
    family: Any, kwargs: dict[str, Any], loss: Callable[[Any, Any], Any], x: Any
) -> Callable[[], None]:
    """One training step of the model built from ``kwargs`` under its family's TP plan
    (``ModelSpec.parallelize_fn``) over the two processes: forward, backward, clipping over the sharded
    gradients, AdamW on the DTensor parameters."""
    from torch.distributed.device_mesh import init_device_mesh

    tp_mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = family.parallelize_fn()(build_family(family, kwargs), tp_mesh=tp_mesh)
    return _next_token_step(model, x, loss)


def _fully_sharded_step(
    family: Any, kwargs: dict[str, Any], loss: Callable[[Any, Any], Any], x: Any
) -> Callable[[], None]:
    """One training step of the model built from ``kwargs``, FSDP2 over the two processes as meshtrain applies
    it (each block a unit, then the root): forward, backward, clipping, AdamW on the sharded parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    model = build_family(family, kwargs)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return _next_token_step(model, x, loss)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_links(sizes: tuple[int, ...] = COMM_SIZES, *, busy: dict[str, Any] | None = None) -> dict[str, float]:
    """Link bandwidths and latencies between two local processes; with ``busy`` (``measure_compute``'s
    result) also the slowdown of compute when both processes compute at once, and the measured step time
    of each layout named in ``busy["fixed_costs"]`` (keyed by the fixed cost it calibrates)."""
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "links.json")
        mp.start_processes(
            _comm_worker, args=(_free_port(), out, sizes, busy), nprocs=2, start_method="spawn", join=True
        )
        with open(out) as f:
            r = json.load(f)
    small, big = sizes[0], sizes[-1]
    ar_lat2, ar_spb = _fit_line(small, r[f"allreduce_{small}"], big, r[f"allreduce_{big}"])  # t = 2α + bytes/β
    p2p_lat, p2p_spb = _fit_line(small, r[f"p2p_{small}"], big, r[f"p2p_{big}"])
    busy_slowdown = max(1.0, r["busy_s"] / r["alone_s"]) if busy is not None else 1.0
    return {
        **{k.removeprefix("step_"): v for k, v in r.items() if k.startswith("step_")},
        **{"cpu_" + k.removeprefix("cpu_step_"): v for k, v in r.items() if k.startswith("cpu_step_")},
        "busy_node_slowdown": busy_slowdown,
        "allreduce_gbps": 8 / ar_spb / 1e9,
        "allreduce_latency_s": ar_lat2 / 2,
        "p2p_gbps": 8 / p2p_spb / 1e9,
        "p2p_latency_s": p2p_lat,
    }


#: the layout whose measured step calibrates each fixed cost, and its global batch in BUSY_BATCH rows
FIXED_COST_LAYOUTS = {
    "ddp_bucket_s": (Candidate(dp=2), 2),
    "pipeline_action_s": (Candidate(pp=2, micro_batches=PIPE_MICRO_BATCHES, schedule="gpipe"), 2),
    "tp_collective_s": (Candidate(tp=2), 1),
    "fsdp_collective_s": (Candidate(dp=2, zero_stage=3), 2),
}


def solve_fixed_costs(hardware: HardwareSpec, *, compute: dict[str, Any], steps: dict[str, float]) -> dict[str, float]:
    """Each fixed cost from the cost model's own step, which is linear in it: measured step = step with the
    cost at 0 + cost x (step with 1 ms - step with 0) / 1 ms, on the calibration model and its layout."""
    shape = compute["shape"]
    base = replace(
        hardware,
        microbatch_overhead_s=compute["proxy_overhead_s"],
        ddp_bucket_s=0.0,
        pipeline_action_s=0.0,
        tp_collective_s=0.0,
        fsdp_collective_s=0.0,
        devices_per_node=max(hardware.devices_per_node, 2),
    )
    solved: dict[str, Any] = {}
    shares: dict[str, float] = {}
    for name, (candidate, batches) in FIXED_COST_LAYOUTS.items():
        if name not in steps:
            continue
        workload = Workload(global_batch_size=batches * BUSY_BATCH, seq_len=compute["seq_len"])
        at_zero = estimate(candidate, model=shape, hardware=base, workload=workload)
        t0 = at_zero.step_time_s
        t1 = estimate(candidate, model=shape, hardware=replace(base, **{name: 1e-3}), workload=workload).step_time_s
        solved[name] = max(0.0, (steps[name] - t0) / (t1 - t0) * 1e-3) if t1 > t0 else 0.0
        charged = steps[name] - t0  # the step's seconds the cost explains
        if f"cpu_{name}" in steps:  # of those, the seconds the process was on a CPU beyond computing and AdamW
            beyond = steps[f"cpu_{name}"] - at_zero.rank_work_s
            shares[name] = min(1.0, max(0.0, beyond / charged)) if solved[name] > 0 and charged > 0 else 0.0
    if shares:
        solved["fixed_cost_cpu_share"] = shares
    return solved


def calibrate_hardware(
    hardware: HardwareSpec, *, model_config: Any, workload: Workload, threads: int, links: bool = True
) -> HardwareSpec:
    """``hardware`` with FLOP/s, overhead, memory bandwidth and (``links``) intra-node links measured here."""
    c = measure_compute(model_config, seq_len=workload.seq_len, threads=threads, max_rows=workload.global_batch_size)
    updates: dict[str, Any] = {
        "flops": c["flops"],
        "microbatch_overhead_s": c["microbatch_overhead_s"],
        "memory_bytes_per_s": c["memory_bytes_per_s"],
    }
    measured = {
        "tflops": c["flops"] / 1e12,
        "microbatch_overhead_ms": c["microbatch_overhead_s"] * 1e3,
        "memory_gbps": c["memory_bytes_per_s"] / 1e9,
    }
    if links and hardware.world_size > 1:
        lk = measure_links(busy=c if hardware.devices_per_node > 1 else None)
        intra = Link(lk["allreduce_gbps"], lk["allreduce_latency_s"])
        updates.update(
            intra=intra,
            p2p=Link(lk["p2p_gbps"], lk["p2p_latency_s"]),
            busy_node_slowdown=lk["busy_node_slowdown"],
        )
        if hardware.nnodes == 1:
            updates["inter"] = intra
        updates.update(solve_fixed_costs(replace(hardware, **updates), compute=c, steps=lk))
        measured.update(
            busy_node_slowdown=lk["busy_node_slowdown"],
            allreduce_gbps=lk["allreduce_gbps"],
            allreduce_latency_us=lk["allreduce_latency_s"] * 1e6,
            p2p_gbps=lk["p2p_gbps"],
            p2p_latency_us=lk["p2p_latency_s"] * 1e6,
        )
        for name, unit, scale in (
            ("ddp_bucket", "us", 1e6),
            ("pipeline_action", "ms", 1e3),
            ("tp_collective", "us", 1e6),
            ("fsdp_collective", "us", 1e6),
        ):
            if f"{name}_s" in updates:
                measured[f"{name}_{unit}"] = updates[f"{name}_s"] * scale
            if f"{name}_s" in updates.get("fixed_cost_cpu_share", {}):
                measured[f"{name}_cpu_share"] = updates["fixed_cost_cpu_share"][f"{name}_s"]
    return replace(hardware, measured=measured, **updates)
