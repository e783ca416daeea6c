"""Config schema of the keys the parallel layer reads: parallel, dp, tp, pp, cp, mp, topology, planner.

The root schema (``conf/schema.py``) types these groups with the classes below, beside the trainer's own
groups; the planner CLI composes the same conf/ and reads only these. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from parallel.foundation.choices import choices
from parallel.pipeline.schedules import SCHEDULES
from parallel.pipeline.split import POLICIES

#: enum-typed choices: a typo fails at compose time with the valid values (parallel/foundation/choices.py)
Schedule = choices("Schedule", SCHEDULES, module=__name__)
SplitPolicy = choices("SplitPolicy", POLICIES, module=__name__)
Backend = choices("Backend", ("auto", "gloo", "nccl"), module=__name__)
Device = choices("Device", ("auto", "cpu", "cuda"), module=__name__)
StartMethod = choices("StartMethod", ("auto", "fork", "spawn"), module=__name__)
#: ``cp.attention``: how attention runs on a split sequence (``parallel/techniques/cp.py``; a ring can join)
CP_ATTENTION = ("ulysses",)
CPAttention = choices("CPAttention", CP_ATTENTION, module=__name__)


@dataclass
class ParallelConfig:
    """Which strategy builds the engine: a built-in ``name`` (``parallel/assembly/registry.py``) brings its class;
    a user's own ``Strategy`` subclass sets ``_target_`` with a name of its own."""

    _target_: str = "${mt_strategy:${.name}}"
    name: str = "ddp"


@dataclass
class DPConfig:
    size: int = 1
    """Data-parallel degree (replicas)."""
    shard: bool = False
    """Shard parameters, gradients and optimizer state over the dp dimension (FSDP2 ``fully_shard``)."""
    bucket_cap_mb: Optional[float] = None
    """DDP gradient bucket size in MiB. null: torch's default, 25 MiB buckets after a first one of 1 MiB (the last
    layers' gradients, whose all-reduce then runs while the backward goes on); a number sizes every bucket, the first
    included. On few cores, bucket size decides how much all-reduce overlaps backward."""
    sync_batchnorm: bool = False
    """Convert BatchNorm layers to SyncBatchNorm so statistics span the global batch."""
    find_unused_parameters: bool = False
    measure_comm: bool = True
    """DDP: on logged steps, read DDP's own reducer timer (from the first bucket all-reduce's launch to the last
    one's completion: comm_time_s, comm_buckets); DDP keeps its C++ all-reduce path on every step. An earlier
    Python comm hook cost 2-5% of tokens/s on 2 CPU ranks (docs/benchmarks.md). FSDP2: its all-gathers and
    reduce-scatters timed on every step through timed custom collectives (comm_time_s, comm_collectives).
    False: neither is measured (FSDP2 keeps its own collectives)."""


@dataclass
class TPConfig:
    size: int = 1
    """Tensor-parallel degree (intra-layer, DTensor)."""
    sequence_parallel: bool = False
    """Shard the residual stream along the sequence between sub-blocks (norms run on the shard)."""
    loss_parallel: bool = False
    """Keep the output projection vocabulary-sharded and compute the loss on the shards."""
    measure_comm: bool = True
    """Time the tp group's collectives (tp_comm_time_s); costs a Python dispatch per op."""


@dataclass
class PPConfig:
    size: int = 1
    """Pipeline-parallel degree (ranks along the pipeline)."""
    micro_batches: int = 1
    schedule: Schedule = Schedule["1f1b"]
    """gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev."""
    split_points: Any = field(default_factory=list)
    """Block indices where a new stage starts; empty or 'auto' lets ``pp.split`` decide."""
    split: SplitPolicy = SplitPolicy["uniform"]
    """Split policy when split_points are not given: uniform or balanced (measured)."""
    stages_per_rank: int = 1
    """Virtual stages per rank, for interleaved/looped/V schedules."""
    trace_step: int = 5
    """Step whose measured schedule is written as a Chrome trace and a Gantt PNG (0 = none)."""


@dataclass
class CPConfig:
    size: int = 1
    """Context-parallel degree: each sample's sequence is split into this many contiguous chunks, one per rank;
    the weights are replicated across them (FSDP2 shards and gradients reduce over dp x cp)."""
    attention: CPAttention = CPAttention["ulysses"]
    """How attention sees the whole sequence: ulysses (all-to-all from sequence-split to head-split q, k, v,
    the model's own kernel on heads / cp heads, all-to-all back; any kernel, CPU and CUDA)."""


@dataclass
class EPConfig:
    size: int = 1
    """Expert-parallel degree: each MoE layer's experts split over this many ranks, borrowed from dp (x cp): it
    divides dp.size x cp.size and model.n_experts, and adds no rank (parallel/techniques/ep.py)."""


@dataclass
class MPConfig:
    split_points: Any = field(default_factory=list)
    """Layer-split model parallel (no micro-batching): block indices where a new stage starts."""


@dataclass
class FixedCostCpuShare:
    """Of each planner fixed cost (``topology.*_us`` / ``*_ms``), the share that is CPU work on the rank rather than
    waiting for a peer, 0-1. CPU ranks beyond the node's cores count it in the time the node needs to compute
    (``topology.calibrate=true`` measures it from the process CPU time of the same whole steps)."""

    ddp_bucket: float = 0.0
    pipeline_action: float = 0.0
    tp_collective: float = 0.0
    fsdp_collective: float = 0.0


@dataclass
class TopologyConfig:
    name: str = "local_cpu"
    nnodes: int = 1
    nproc_per_node: Optional[int] = None
    """Workers per node; null means dp.size*tp.size*pp.size / nnodes."""
    node_rank: int = 0
    backend: Backend = Backend["auto"]
    """auto (nccl on CUDA, else gloo), gloo or nccl."""
    device: Device = Device["auto"]
    """auto, cpu or cuda."""
    master_addr: str = "localhost"
    master_port: int = 0
    """0 picks a free port (single node)."""
    max_restarts: int = 0
    rendezvous_timeout_s: float = 600.0
    """Multi-node: how long a node waits for the others to join before it gives up (exit code 3)."""
    timeout_s: float = 300.0
    """Collective timeout: a rank that stops answering fails the job after this long."""
    threads_per_rank: int = 1
    """torch.set_num_threads per worker; ranks share the cores."""
    reuse_host_memory: bool = True
    """Each worker keeps the host memory it frees for its next step (glibc's mmap and trim thresholds raised:
    trainer/launch/host_memory.py) instead of taking fresh pages every step; false keeps glibc's defaults."""
    start_method: StartMethod = StartMethod["auto"]
    """How the launcher starts local workers: fork (they inherit the launcher's imports: no second import of
    torch per worker), spawn (a fresh interpreter each), or auto: fork for CPU workers on Linux, spawn when the
    workers use CUDA (a CUDA context does not survive fork)."""
    # Hardware description for the planner (per device / per link).
    device_memory_gb: float = 8.0
    device_tflops: float = 0.05
    intra_node_gbps: float = 8.0
    inter_node_gbps: float = 1.0
    intra_node_latency_us: float = 50.0
    inter_node_latency_us: float = 100.0
    """Bandwidths are per device and in Gbit/s (1 GbE = 1.0); latencies per message."""
    devices_per_node: Optional[int] = None
    """Devices the planner may use per node; null = nproc_per_node, else the CPU count (cpu) or 8 (cuda)."""
    memory_gbps: float = 100.0
    """Device memory bandwidth in GB/s (bytes): the optimizer step is bound by it."""
    microbatch_overhead_ms: float = 0.0
    """Fixed cost of one forward+backward pass of the whole model besides its FLOPs (framework, small kernels)."""
    pipeline_action_ms: float = 0.0
    """Fixed cost of one pipeline action (a stage's forward or backward of one micro-batch) besides its compute
    and its message: the schedule's bookkeeping, posting send/recv, waking the peer (calibrate measures it)."""
    tp_collective_us: float = 0.0
    """Fixed cost of one tensor-parallel collective besides the link's latency and bandwidth: DTensor's
    dispatch of the collective and of the sharded ops around it (calibrate measures it)."""
    fsdp_collective_us: float = 0.0
    """Fixed cost of one FSDP2 all-gather or reduce-scatter besides the link's latency and bandwidth: its
    hooks and buffer copies, and the sharded (DTensor) parameters' clipping and optimizer step, per
    collective (calibrate measures it)."""
    ddp_bucket_us: float = 0.0
    """Fixed cost of one DDP gradient bucket besides the ring formula: the reducer's hooks and bucket copies, and
    the all-reduce exposed after the backward while its thread competes with the node's compute (calibrate
    measures it on a whole DDP step)."""
    fixed_cost_cpu_share: FixedCostCpuShare = field(default_factory=FixedCostCpuShare)
    """Of each fixed cost above, the share that is CPU work on the rank rather than waiting for a peer."""
    p2p_gbps: Optional[float] = None
    """Point-to-point bandwidth between pipeline neighbours (Gbit/s); null = the link's bandwidth."""
    p2p_latency_us: Optional[float] = None
    dp_comm_overlap: float = 0.0
    """Share of the data-parallel gradient all-reduce hidden behind the backward pass (0 on few CPU cores)."""
    busy_node_slowdown: float = 1.0
    """Compute slowdown of a device while its node's other devices compute too (calibrate measures it)."""
    devices_per_nic: int = 1
    """Devices sharing one inter-node link of inter_node_gbps (8 behind a node's single 1 GbE port)."""
    device_peak_tflops: Optional[float] = None
    """Peak dense TFLOP/s of one device in the training precision, the denominator of MFU (e.g. 989 for an
    H100 SXM in bf16). null: a known GPU's bf16 peak, else a matmul measured at start (CPU)."""
    calibrate: bool = False
    """Measure FLOP/s, overhead, memory, all-reduce and p2p bandwidth on this machine instead of the preset."""


@dataclass
class PlannerConfig:
    """What the cost model assumes about a training job (``parallel.plan.search``, ``python -m parallel.plan``)."""

    precision: str = "auto"
    """fp32 (4-byte params, grads, Adam states), mixed (bf16/fp16 params and grads + fp32 master and Adam, ZeRO's K=12), or auto (mixed on cuda, fp32 on cpu)."""
    recompute: str = "auto"
    """Activation recomputation the planner may use: none, selective, full, any (enumerate all three), or auto (none
    first; when nothing fits without recomputation, all three, and the reason line says so)."""
    memory_fraction: float = 0.9
    """Share of device memory a layout may plan to use (the rest: allocator, buffers, fragmentation)."""
    global_batch_size: Optional[int] = None
    """Samples per step to plan for; null = model.global_batch_size (planner-only models) or data.global_batch_size."""
    seq_len: Optional[int] = None
    """Tokens per sample to plan for; null = model.max_seq_len (planner-only models) or data.seq_len."""
    top: int = 10
    """Candidates printed by parallel=auto and python -m parallel.plan."""
