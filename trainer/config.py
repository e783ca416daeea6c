"""Typed config schema, registered in Hydra's ConfigStore.

Every key a user can set lives here with its type, so a misspelled key or a wrong type fails at
compose time, before anything starts. Groups whose options differ in shape (model, data, optim)
register one schema per shape in their group (``gpt_schema``, ``text_schema`` ...) and each YAML
option extends its schema through its defaults list, the pattern Hydra documents for extending
structured configs. This module imports no torch: validation must stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

STRATEGIES = ("single", "dp", "ddp", "fsdp", "mp", "tp", "pp", "hybrid", "auto")


@dataclass
class ParallelConfig:
    """Which strategy class builds the engine; ``_target_`` may name a user's own class."""

    _target_: str = "parallel.ddp.DDPStrategy"
    name: str = "ddp"


@dataclass
class DPConfig:
    size: int = 1
    """Data-parallel degree (replicas)."""
    shard: bool = False
    """Shard parameters, gradients and optimizer state over the dp dimension (FSDP2 ``fully_shard``)."""
    bucket_cap_mb: float = 25.0
    """DDP gradient bucket size: on few cores, bucket size decides how much all-reduce overlaps backward."""
    sync_batchnorm: bool = False
    """Convert BatchNorm layers to SyncBatchNorm so statistics span the global batch."""
    find_unused_parameters: bool = False


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
    schedule: str = "1f1b"
    """gpipe, 1f1b, interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev."""
    split_points: Any = field(default_factory=list)
    """Block indices where a new stage starts; empty or 'auto' lets ``pp.split`` decide."""
    split: str = "uniform"
    """Split policy when split_points are not given: uniform or balanced (measured)."""
    stages_per_rank: int = 1
    """Virtual stages per rank, for interleaved/looped/V schedules."""
    trace_step: int = 5
    """Step whose measured schedule is written as a Chrome trace and a Gantt PNG (0 = none)."""


@dataclass
class MPConfig:
    split_points: Any = field(default_factory=list)
    """Layer-split model parallel (no micro-batching): block indices where a new stage starts."""


@dataclass
class TopologyConfig:
    name: str = "local_cpu"
    nnodes: int = 1
    nproc_per_node: Optional[int] = None
    """Workers per node; null means dp.size*tp.size*pp.size / nnodes."""
    node_rank: int = 0
    backend: str = "auto"
    """auto (nccl on CUDA, else gloo), gloo or nccl."""
    device: str = "auto"
    """auto, cpu or cuda."""
    master_addr: str = "localhost"
    master_port: int = 0
    """0 picks a free port (single node)."""
    max_restarts: int = 0
    timeout_s: float = 300.0
    """Collective timeout: a rank that stops answering fails the job after this long."""
    threads_per_rank: int = 1
    """torch.set_num_threads per worker; ranks share the cores."""
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
    p2p_gbps: Optional[float] = None
    """Point-to-point bandwidth between pipeline neighbours (Gbit/s); null = the link's bandwidth."""
    p2p_latency_us: Optional[float] = None
    dp_comm_overlap: float = 0.0
    """Share of the data-parallel gradient all-reduce hidden behind the backward pass (0 on few CPU cores)."""
    busy_node_slowdown: float = 1.0
    """Compute slowdown of a device while its node's other devices compute too (calibrate measures it)."""
    devices_per_nic: int = 1
    """Devices sharing one inter-node link of inter_node_gbps (8 behind a node's single 1 GbE port)."""
    calibrate: bool = False
    """Measure FLOP/s, overhead, memory, all-reduce and p2p bandwidth on this machine instead of the preset."""


@dataclass
class PlannerConfig:
    """What the cost model assumes about a training job (``parallel.planner``, ``python -m parallel.plan``)."""

    precision: str = "auto"
    """fp32 (4-byte params, grads, Adam states), mixed (bf16/fp16 params and grads + fp32 master and Adam, ZeRO's K=12), or auto (mixed on cuda, fp32 on cpu)."""
    recompute: str = "none"
    """Activation recomputation the planner may use: none, selective, full, or any (enumerate all three)."""
    memory_fraction: float = 0.9
    """Share of device memory a layout may plan to use (the rest: allocator, buffers, fragmentation)."""
    global_batch_size: Optional[int] = None
    """Samples per step to plan for; null = model.global_batch_size (planner-only models) or data.global_batch_size."""
    seq_len: Optional[int] = None
    """Tokens per sample to plan for; null = model.max_seq_len (planner-only models) or data.seq_len."""
    top: int = 10
    """Candidates printed by parallel=auto and python -m parallel.plan."""


@dataclass
class TrainerConfig:
    max_steps: int = 200
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 100
    """Save a checkpoint every N steps and at the last step; 0 disables checkpoints."""
    keep_checkpoints: int = 2
    resume: str = "auto"
    """auto (newest complete checkpoint in the run folder), never, or a checkpoint path."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    objective: str = "tokens_per_s"
    """summary.json key the task returns to Hydra sweepers."""
    stop_grace_s: float = 15.0
    """After SIGTERM/SIGUSR1, how long a rank may take to reach a step boundary before it just exits."""
    on_nonfinite: str = "stop"
    """stop or skip when the loss or gradient norm is not finite."""


@dataclass
class WandbConfig:
    mode: str = "offline"
    """offline (default here), online (needs an account), or disabled."""
    project: str = "meshtrain"
    entity: Optional[str] = None
    group: Optional[str] = None
    """Defaults to the sweep folder name in multirun."""
    tags: List[str] = field(default_factory=list)
    init_timeout: float = 15.0
    """Seconds to wait for an online W&B server before falling back to offline."""
    system_stats: bool = False
    """W&B's system monitor (CPU/GPU/memory sampling). Its process competes with training on few
    cores (measured here: -49% tokens/s on 2 cores); turn it on for GPU nodes."""
    console: str = "off"
    """W&B console capture (off, wrap, redirect); logs/rank0.log already keeps the console."""


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


# ---- per-shape schemas for model / data / optim --------------------------------------------


@dataclass
class GPTConfig:
    _target_: str = "models.gpt.GPT"
    name: str = "gpt"
    vocab_size: int = 256
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 0
    """Feed-forward width; 0 means 4 * d_model."""
    layer_d_ff: List[int] = field(default_factory=list)
    """Per-block feed-forward widths (uneven models); empty means d_ff everywhere."""
    max_seq_len: int = 128
    dropout: float = 0.0


@dataclass
class GPTDescriptionConfig(GPTConfig):
    """A GPT far too big to build here, described for the planner only (``python -m parallel.plan``)."""

    _target_: str = "parallel.model_spec.refuse_to_build"
    planner_only: bool = True
    global_batch_size: int = 512
    """The batch the published run used (samples of max_seq_len tokens)."""
    source: str = ""
    """Where the shape comes from."""


@dataclass
class CNNConfig:
    _target_: str = "models.cnn.ConvNet"
    name: str = "cnn"
    in_channels: int = 3
    channels: List[int] = field(default_factory=lambda: [16, 32, 64])
    num_classes: int = 10
    batch_norm: bool = True


@dataclass
class TextDataConfig:
    _target_: str = "trainer.data.TextCorpus"
    name: str = "text"
    path: Optional[str] = None
    """A UTF-8 text file (byte tokens), or a .npy / .bin token file; null = Python's own stdlib sources."""
    cache_dir: str = "${oc.env:MESHTRAIN_CACHE,${oc.env:HOME}/.cache/meshtrain}"
    max_bytes: int = 4_000_000
    """How much of the stdlib corpus to read (first run only; cached as a token file)."""
    global_batch_size: int = 16
    """Samples the optimizer sees per step, whatever the layout."""
    micro_batch_size: Optional[int] = None
    """Samples per forward pass on one rank; null = no gradient accumulation (pp: from micro_batches)."""
    seq_len: int = 128


@dataclass
class ImageDataConfig:
    _target_: str = "trainer.data.SyntheticImages"
    name: str = "images"
    path: Optional[str] = None
    global_batch_size: int = 32
    micro_batch_size: Optional[int] = None
    seq_len: int = 1
    """Images have no sequence; kept at 1 so throughput reads as samples/s."""
    image_size: int = 16
    channels: int = 3
    num_classes: int = 10
    noise: float = 0.5


@dataclass
class OptimConfig:
    _target_: str = "torch.optim.AdamW"
    name: str = "adamw"
    lr: float = 3e-3
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    warmup_steps: int = 10
    decay: str = "cosine"
    """cosine or constant after warm-up."""
    min_lr_ratio: float = 0.1


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    name: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "constant"
    min_lr_ratio: float = 1.0


#: keys of an optim node that configure the schedule, not the optimizer constructor
SCHEDULE_KEYS = ("name", "warmup_steps", "decay", "min_lr_ratio")


@dataclass
class MeshtrainConfig:
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    dp: DPConfig = field(default_factory=DPConfig)
    tp: TPConfig = field(default_factory=TPConfig)
    pp: PPConfig = field(default_factory=PPConfig)
    mp: MPConfig = field(default_factory=MPConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    model: Any = MISSING
    data: Any = MISSING
    optim: Any = MISSING
    debug: Any = field(default_factory=dict)
    """Fault injection and diagnostics (``+debug.fail_at_step=3`` ...)."""


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="meshtrain_schema", node=MeshtrainConfig)
    cs.store(group="model", name="gpt_schema", node=GPTConfig)
    cs.store(group="model", name="gpt_description_schema", node=GPTDescriptionConfig)
    cs.store(group="model", name="cnn_schema", node=CNNConfig)
    cs.store(group="data", name="text_schema", node=TextDataConfig)
    cs.store(group="data", name="images_schema", node=ImageDataConfig)
    cs.store(group="optim", name="adamw_schema", node=OptimConfig)
    cs.store(group="optim", name="sgd_schema", node=SGDConfig)
