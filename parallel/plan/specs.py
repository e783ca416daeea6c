"""What the planner knows about a model, a machine and a job, read from the config alone (no torch).

Besides ``ModelShape`` (a decoder-only transformer's shape: parameter count and FLOPs per token; ``models/shape.py``,
built by the model family's ``ModelSpec.shape``), two frozen dataclasses: ``HardwareSpec`` (one device and its links,
from ``topology``) and ``Workload`` (batch, sequence, precision: ``parallel/foundation/precision.py``). Their builders read the
typed ``topology`` and ``planner`` sections (``parallel/config.py``) and the model's typed config, which the planner's
entry point (``parallel/plan/cli.py``) and the trainer make of the composed config, so the planner works for models
far too big to build here (``conf/model/gpt_175b.yaml``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from models.shape import ModelShape, PlanError
from parallel.foundation.checkpointing_modes import AC_MODES
from parallel.foundation.precision import PLANNER_PRECISIONS, planner_precision

if TYPE_CHECKING:
    from parallel.config import PlannerConfig, TopologyConfig

__all__ = ["ModelShape", "PlanError", "HardwareSpec", "Workload", "Link"]

GB = 1e9

#: suffixes of counts as people write them, largest first
COUNT_SUFFIXES = (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3))


def count_text(n: float) -> str:
    """A count as people write it, one decimal at most: 870.7K, 124.4M, 1.2B, 175B (``1e-9 * n`` with a B
    suffix printed a 0.9M-parameter model as "0.0008707B")."""
    for suffix, scale in COUNT_SUFFIXES:
        if abs(round(n / scale, 1)) >= 1:  # rounded first: 999,950 is 1M, not 1000K
            return f"{n / scale:.1f}".removesuffix(".0") + suffix
    return f"{n:.0f}"


#: the planner's precision -> the trainer.precision that trains it (parallel=auto sets it)
#: bytes of one fp32 moment (Adam's first or second, Muon's momentum) per parameter
MOMENT_BYTES = 4


def muon_workload(optim: Any) -> dict[str, Any]:
    """The Workload fields of an optim section: ``optimizer=muon`` and its keys for ``optim=muon``, none else."""
    if optim is None or str(optim.get("name", "")) != "muon":
        return {}
    return {
        "optimizer": "muon",
        "muon_gather": str(optim.get("muon_gather", "spread")),
        "ns_steps": int(optim.get("ns_steps", 5)),
    }


TRAINER_PRECISION = {name: p.trains_as for name, p in PLANNER_PRECISIONS.items()}


@dataclass(frozen=True)
class Link:
    gbps: float
    """Gbit/s per device."""
    latency_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


@dataclass(frozen=True)
class HardwareSpec:
    """One device and the links between devices, from ``topology`` (or measured: ``parallel.plan.calibrate``)."""

    name: str
    nnodes: int
    devices_per_node: int
    device: str
    memory_bytes: float
    flops: float
    """Sustained FLOP/s of one device on this model's matmuls."""
    memory_bytes_per_s: float
    intra: Link
    inter: Link
    p2p: Link
    microbatch_overhead_s: float = 0.0
    cores_per_node: int | None = None
    """CPU devices: the node's cores, which ranks beyond them time-share (None: devices do not share)."""
    threads_per_device: int = 1
    pipeline_action_s: float = 0.0
    """Fixed cost of one pipeline action (F, B or W of one micro-batch on one stage) besides compute and p2p."""
    tp_collective_s: float = 0.0
    """Fixed cost of one tensor-parallel collective besides the link's latency and bandwidth."""
    fsdp_collective_s: float = 0.0
    """Fixed cost of one FSDP2 all-gather or reduce-scatter besides the link's: hooks, copy-in/out, and the
    DTensor parameters' optimizer and clipping, per collective."""
    ddp_bucket_s: float = 0.0
    """Fixed cost of one DDP gradient bucket besides the ring formula (reducer hooks, bucket copies, the exposed
    all-reduce competing with the node's compute), solved from a whole DDP step by the calibration."""
    fixed_cost_cpu_share: dict[str, float] = field(default_factory=dict)
    """Per fixed cost (``"tp_collective_s"`` ...), the share of it that is CPU work on the rank rather than waiting
    for a peer: measured by the calibration from the same whole steps' process CPU time. CPU ranks beyond the
    node's cores count it in their time-share floor (``cost_model.estimate``); absent: 0."""
    dp_comm_overlap: float = 0.0
    busy_node_slowdown: float = 1.0
    """How much slower one device computes while the other devices of its node compute too (shared
    memory bandwidth, caches, power budget); about 1 for GPUs, measured 1.3-1.5 on this 2-core CPU."""
    devices_per_nic: int = 1
    """Devices sharing one inter-node link; ``inter`` already holds each one's share."""
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    def crosses_nodes(self, *, span: int, stride: int) -> bool:
        """Whether a group of ``span`` ranks ``stride`` apart reaches beyond one node."""
        return self.nnodes > 1 and span > 1 and span * stride > self.devices_per_node

    def link_for(self, *, span: int, stride: int) -> Link:
        """The slowest link a group of ``span`` ranks ``stride`` apart crosses (ranks fill nodes in order)."""
        return self.inter if span * stride > self.devices_per_node else self.intra

    @classmethod
    def from_topology(cls, topo: TopologyConfig) -> HardwareSpec:
        """The hardware a typed ``topology`` describes (``parallel/config.py``'s ``TopologyConfig``)."""
        device = str(topo.device)
        per_node = topo.devices_per_node or topo.nproc_per_node
        if per_node is None:
            per_node = (os.cpu_count() or 1) if device in ("cpu", "auto") else 8
        intra = Link(float(topo.intra_node_gbps), float(topo.intra_node_latency_us) * 1e-6)
        sharing = max(1, min(int(topo.devices_per_nic or 1), int(per_node)))
        # every device of a node talks across nodes at once (dp rings, pp boundaries): they share the NIC
        inter = Link(float(topo.inter_node_gbps) / sharing, float(topo.inter_node_latency_us) * 1e-6)
        p2p = Link(
            float(topo.p2p_gbps) if topo.p2p_gbps is not None else intra.gbps,
            float(topo.p2p_latency_us) * 1e-6 if topo.p2p_latency_us is not None else intra.latency_s,
        )
        for key in ("device_memory_gb", "device_tflops", "intra_node_gbps", "inter_node_gbps", "memory_gbps"):
            if float(getattr(topo, key)) <= 0:
                raise PlanError(f"topology.{key}={getattr(topo, key)}: must be > 0 for the planner")
        shares = {k: float(v) for k, v in asdict(topo.fixed_cost_cpu_share).items() if v}
        for key, value in shares.items():  # the keys are the schema's (parallel/config.py: FixedCostCpuShare)
            if not 0.0 <= value <= 1.0:
                raise PlanError(
                    f"topology.fixed_cost_cpu_share.{key}={value}: must be a share from 0 to 1 (of that fixed cost, "
                    "the part that is CPU work on the rank)"
                )
        return cls(
            name=str(topo.name),
            nnodes=int(topo.nnodes),
            devices_per_node=int(per_node),
            device=device,
            memory_bytes=float(topo.device_memory_gb) * GB,
            flops=float(topo.device_tflops) * 1e12,
            memory_bytes_per_s=float(topo.memory_gbps) * GB,
            intra=intra,
            inter=inter,
            p2p=p2p,
            microbatch_overhead_s=float(topo.microbatch_overhead_ms) * 1e-3,
            pipeline_action_s=float(topo.pipeline_action_ms or 0.0) * 1e-3,
            cores_per_node=(os.cpu_count() or 1) if device in ("cpu", "auto") else None,
            threads_per_device=int(topo.threads_per_rank or 1),
            tp_collective_s=float(topo.tp_collective_us or 0.0) * 1e-6,
            fsdp_collective_s=float(topo.fsdp_collective_us or 0.0) * 1e-6,
            ddp_bucket_s=float(topo.ddp_bucket_us or 0.0) * 1e-6,
            dp_comm_overlap=float(topo.dp_comm_overlap),
            busy_node_slowdown=float(topo.busy_node_slowdown),
            devices_per_nic=sharing,
            fixed_cost_cpu_share={f"{k}_s": v for k, v in shares.items()},
        )


@dataclass(frozen=True)
class Workload:
    global_batch_size: int
    seq_len: int
    precision: str = "fp32"
    memory_fraction: float = 0.9
    recompute: tuple[str, ...] = ("none",)
    """The recomputation modes candidates may use (``planner.recompute``)."""
    recompute_fallback: tuple[str, ...] = ()
    """Modes to plan with when nothing fits with ``recompute`` (``planner.recompute=auto``: none first, then every
    mode; ``search.plan`` says so in the reason line). Empty: ``recompute`` is strict."""
    implementation: str = "meshtrain"
    """Whose blocks the memory terms count: ``meshtrain`` (what meshtrain's models and tensor-parallel plans
    hold and save, checked by the dry run: ``parallel/plan/dry_run.py``) or ``megatron`` (Megatron-LM's, as
    ZeRO and Korthikanti et al. count them)."""

    optimizer: str = "adamw"
    """``adamw`` (two moments per parameter), or ``muon`` (``optim=muon``: one momentum buffer for the blocks' weight
    matrices, AdamW's two for the rest; the matrices gathered whole and orthogonalised: ``parallel/plan/muon_cost.py``)."""
    muon_gather: str = "spread"
    """``optim.muon_gather``: spread (each matrix orthogonalised by one owner rank) or everywhere."""
    ns_steps: int = 5
    """``optim.ns_steps``: Newton-Schulz iterations per matrix and step."""
    reference_copy: bool = False
    """The run keeps a frozen reference model on the ranks (DPO with ``trainer.preference.reference=copy``): one more
    copy of the weights, sharded like them, with no gradients or optimizer state (none with LoRA: the base with the
    adapters off is the reference), and one more forward per micro-batch. The one-off pass of ``reference=pass``
    costs nothing per step and is not counted."""

    @property
    def meshtrain(self) -> bool:
        """The memory terms count meshtrain's blocks (``implementation``), not Megatron-LM's."""
        return self.implementation == "meshtrain"

    @property
    def muon_bytes_per_param(self) -> tuple[int, int, int]:
        """``bytes_per_param`` of a matrix Muon updates: one fp32 momentum buffer instead of AdamW's two moments."""
        w, g, k = self.bytes_per_param
        return w, g, k - MOMENT_BYTES

    @property
    def bytes_per_param(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer states) per parameter. meshtrain's bf16-mixed keeps fp32 weights
        (the master copy: FSDP2 casts to bf16 per block, transiently; autocast casts per op) and fp32
        gradients (reduced in fp32), so it holds 4 + 4 + 8 where ZeRO's mixed precision holds 2 + 2 + 12:
        the same 16 bytes, split differently."""
        if self.meshtrain:
            return PLANNER_PRECISIONS["fp32"].state_bytes
        return PLANNER_PRECISIONS[self.precision].state_bytes

    @property
    def activation_bytes(self) -> int:
        return PLANNER_PRECISIONS[self.precision].activation_bytes

    @classmethod
    def of(
        cls,
        planner: PlannerConfig,
        *,
        model: Any,
        global_batch_size: int,
        seq_len: int,
        trainer_precision: str | None,
        hardware: HardwareSpec,
        optim: Any = None,
        reference_copy: bool = False,
    ) -> Workload:
        """The job a typed ``planner`` section plans for: ``model`` (its typed config), the data's batch and
        sequence, and the run's ``trainer.precision`` (None: a config without a trainer, the planner's own); ``optim``:
        the run's optim section (``optim=muon``: its gather way and Newton-Schulz steps), None: AdamW."""
        # a description of a published run (gpt_175b, llama3_8b ...) carries that run's batch and sequence
        described = model.get("global_batch_size") is not None
        gbs = planner.global_batch_size or (model.get("global_batch_size") if described else global_batch_size)
        seq = planner.seq_len or (model.get("max_seq_len") if described else seq_len)
        precision = str(planner.precision)
        if precision == "auto":  # what the run will train in (parallel/foundation/precision.py's one mapping)
            precision = planner_precision(trainer_precision or "fp32", device=hardware.device)
        if precision not in PLANNER_PRECISIONS:
            raise PlanError(
                f"planner.precision={planner.precision}: use auto or one of {', '.join(PLANNER_PRECISIONS)}"
            )
        recompute = str(planner.recompute)
        options = {**{mode: (mode,) for mode in AC_MODES}, "any": AC_MODES, "auto": ("none",)}
        if recompute not in options:
            raise PlanError(f"planner.recompute={recompute}: use auto, {', '.join(AC_MODES)} or any")
        fraction = float(planner.memory_fraction)
        if not 0 < fraction <= 1:
            raise PlanError(f"planner.memory_fraction={fraction}: must be in (0, 1]")
        return cls(
            global_batch_size=int(gbs),
            seq_len=int(seq),
            precision=precision,
            memory_fraction=fraction,
            recompute=options[recompute],
            recompute_fallback=AC_MODES if recompute == "auto" else (),
            **muon_workload(optim),
            reference_copy=reference_copy,
        )
