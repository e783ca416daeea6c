"""What the planner knows about a model, a machine and a job, read from the config alone (no torch).

Three frozen dataclasses: ``ModelSpec`` (a decoder-only transformer's shape: parameter count and FLOPs per
token), ``HardwareSpec`` (one device and its links, from ``topology``) and ``Workload`` (batch, sequence,
precision). ``from_cfg`` builders read the composed Hydra config, so the planner works for models far too
big to build here (``conf/model/gpt_175b.yaml``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

GB = 1e9

PRECISIONS = {
    # bytes per parameter for (weights, gradients, optimizer states) with Adam, as in ZeRO (arXiv
    # 1910.02054, section 3.1): mixed precision keeps fp16/bf16 weights and grads plus an fp32 master copy,
    # momentum and variance (K = 12); fp32 keeps weights, grads, momentum and variance (4 + 4 + 8).
    "fp32": (4, 4, 8),
    "mixed": (2, 2, 12),
}
ACTIVATION_BYTES = {"fp32": 4, "mixed": 2}


class PlanError(ValueError):
    """The planner cannot describe this config; the message names the key, its value and the fix."""


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-style decoder: embeddings, ``n_layers`` blocks (attention + 2-matrix MLP), final norm, head."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    max_seq_len: int
    layer_d_ff: tuple[int, ...] = ()
    bias: bool = False
    """Linear layers with biases (Megatron's GPT) or without (``models/gpt/model.py``)."""
    tied_embeddings: bool = False
    """Output head shares the token embedding (Megatron's GPT) or has its own (``models/gpt/model.py``)."""

    def __post_init__(self) -> None:
        if not self.layer_d_ff:
            object.__setattr__(self, "layer_d_ff", (4 * self.d_model,) * self.n_layers)
        if len(self.layer_d_ff) != self.n_layers:
            raise PlanError(f"model.layer_d_ff has {len(self.layer_d_ff)} entries for model.n_layers={self.n_layers}")

    # ---- parameters ------------------------------------------------------------------------------

    def layer_params(self, i: int) -> int:
        """Attention 4h² + MLP 2·h·d_ff + two LayerNorms 4h (+ biases 4h + d_ff + h): Megatron's 12h² + 13h."""
        h, f = self.d_model, self.layer_d_ff[i]
        return 4 * h * h + 2 * h * f + 4 * h + ((4 * h + f + h) if self.bias else 0)

    def layer_norm_params(self, i: int) -> int:
        """The block's two LayerNorms (weight and bias each): the part tensor parallel does not shard."""
        return 4 * self.d_model

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model + self.max_seq_len * self.d_model

    @property
    def head_params(self) -> int:
        """Final LayerNorm and, unless tied, the output projection V·h."""
        return 2 * self.d_model + (0 if self.tied_embeddings else self.vocab_size * self.d_model)

    @property
    def params(self) -> int:
        return self.embedding_params + sum(self.layer_params(i) for i in range(self.n_layers)) + self.head_params

    # ---- FLOPs -----------------------------------------------------------------------------------

    def layer_forward_flops_per_token(self, i: int, seq_len: int) -> float:
        """Matmul FLOPs of one block per token, forward: 2·(4h² + 2·h·d_ff) + attention 2·2·s·h.

        Megatron-LM 2021 (arXiv 2104.04473, appendix "Floating-point operations"): 24h² + 4sh per token with
        d_ff = 4h, i.e. 24h²(1 + s/6h); the attention score and value products are counted in full (no
        causal halving), as there.
        """
        h = self.d_model
        return 2 * (4 * h * h + 2 * h * self.layer_d_ff[i]) + 4 * seq_len * h

    def logit_forward_flops_per_token(self) -> float:
        """The output projection: 2·V·h per token (Megatron: the V/(16lh) term of the FLOPs formula)."""
        return 2 * self.vocab_size * self.d_model

    def training_flops_per_token(self, seq_len: int, *, recompute: str = "none") -> float:
        """Forward + backward (2× forward) FLOPs per token; full recomputation re-runs every block forward.

        With ``recompute="full"`` this is Megatron-LM 2021's 96·B·s·l·h²(1 + s/6h + V/16lh) per iteration
        divided by B·s tokens (arXiv 2104.04473, eq. 3). Selective recomputation (arXiv 2205.05198) re-runs
        only the attention score/softmax/value part: + 4sh per layer and token.
        """
        layers = sum(self.layer_forward_flops_per_token(i, seq_len) for i in range(self.n_layers))
        extra = {"none": 0.0, "selective": 4.0 * seq_len * self.d_model * self.n_layers, "full": layers}[recompute]
        return 3 * layers + extra + 3 * self.logit_forward_flops_per_token()

    # ---- builders --------------------------------------------------------------------------------

    @classmethod
    def from_cfg(cls, model: Any) -> ModelSpec:
        """Read ``cfg.model``; raise ``PlanError`` for models the planner cannot describe (e.g. the CNN)."""
        missing = [k for k in ("n_layers", "d_model", "n_heads", "vocab_size") if k not in model]
        if missing:
            raise PlanError(
                f"model={model.get('name', '?')}: the planner describes GPT-style models only (missing "
                f"model.{', model.'.join(missing)}); choose model=gpt_small or another GPT description"
            )
        d_ff = int(model.get("d_ff", 0) or 0) or 4 * int(model.d_model)
        layer_d_ff = tuple(int(x) for x in (model.get("layer_d_ff") or ())) or (d_ff,) * int(model.n_layers)
        return cls(
            name=str(model.get("name", "gpt")),
            n_layers=int(model.n_layers),
            d_model=int(model.d_model),
            n_heads=int(model.n_heads),
            vocab_size=int(model.vocab_size),
            max_seq_len=int(model.max_seq_len),
            layer_d_ff=layer_d_ff,
        )


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

    def link_for(self, *, span: int, stride: int) -> Link:
        """The slowest link a group of ``span`` ranks ``stride`` apart crosses (ranks fill nodes in order)."""
        return self.inter if span * stride > self.devices_per_node else self.intra

    @classmethod
    def from_cfg(cls, topo: Any) -> HardwareSpec:
        device = str(topo.get("device", "cpu"))
        per_node = topo.get("devices_per_node") or topo.get("nproc_per_node")
        if per_node is None:
            per_node = (os.cpu_count() or 1) if device in ("cpu", "auto") else 8
        intra = Link(float(topo.intra_node_gbps), float(topo.intra_node_latency_us) * 1e-6)
        sharing = max(1, min(int(topo.get("devices_per_nic", 1) or 1), int(per_node)))
        # every device of a node talks across nodes at once (dp rings, pp boundaries): they share the NIC
        inter = Link(float(topo.inter_node_gbps) / sharing, float(topo.inter_node_latency_us) * 1e-6)
        p2p_gbps = topo.get("p2p_gbps")
        p2p_lat = topo.get("p2p_latency_us")
        p2p = Link(
            float(p2p_gbps) if p2p_gbps is not None else intra.gbps,
            float(p2p_lat) * 1e-6 if p2p_lat is not None else intra.latency_s,
        )
        for key in ("device_memory_gb", "device_tflops", "intra_node_gbps", "inter_node_gbps", "memory_gbps"):
            if float(topo.get(key, 1.0)) <= 0:
                raise PlanError(f"topology.{key}={topo.get(key)}: must be > 0 for the planner")
        return cls(
            name=str(topo.get("name", "topology")),
            nnodes=int(topo.nnodes),
            devices_per_node=int(per_node),
            device=device,
            memory_bytes=float(topo.device_memory_gb) * GB,
            flops=float(topo.device_tflops) * 1e12,
            memory_bytes_per_s=float(topo.get("memory_gbps", 100.0)) * GB,
            intra=intra,
            inter=inter,
            p2p=p2p,
            microbatch_overhead_s=float(topo.get("microbatch_overhead_ms", 0.0)) * 1e-3,
            pipeline_action_s=float(topo.get("pipeline_action_ms", 0.0) or 0.0) * 1e-3,
            cores_per_node=(os.cpu_count() or 1) if device in ("cpu", "auto") else None,
            threads_per_device=int(topo.get("threads_per_rank", 1) or 1),
            tp_collective_s=float(topo.get("tp_collective_us", 0.0) or 0.0) * 1e-6,
            dp_comm_overlap=float(topo.get("dp_comm_overlap", 0.0)),
            busy_node_slowdown=float(topo.get("busy_node_slowdown", 1.0)),
            devices_per_nic=sharing,
        )


@dataclass(frozen=True)
class Workload:
    global_batch_size: int
    seq_len: int
    precision: str = "fp32"
    memory_fraction: float = 0.9
    recompute: tuple[str, ...] = ("none",)
    implementation: str = "meshtrain"
    """Whose blocks the memory terms count: ``meshtrain`` (what meshtrain's models and tensor-parallel plans
    hold and save, checked by the dry run: ``parallel/plan/dry_run.py``) or ``megatron`` (Megatron-LM's, as
    ZeRO and Korthikanti et al. count them)."""

    @property
    def bytes_per_param(self) -> tuple[int, int, int]:
        """(weights, gradients, optimizer states) per parameter. meshtrain's bf16-mixed keeps fp32 weights
        (the master copy: FSDP2 casts to bf16 per block, transiently; autocast casts per op) and fp32
        gradients (reduced in fp32), so it holds 4 + 4 + 8 where ZeRO's mixed precision holds 2 + 2 + 12:
        the same 16 bytes, split differently."""
        if self.implementation == "meshtrain":
            return PRECISIONS["fp32"]
        return PRECISIONS[self.precision]

    @property
    def activation_bytes(self) -> int:
        return ACTIVATION_BYTES[self.precision]

    @classmethod
    def from_cfg(cls, cfg: Any, *, hardware: HardwareSpec) -> Workload:
        planner, model = cfg.planner, cfg.model
        described = bool(model.get("planner_only", False))
        gbs = planner.get("global_batch_size") or (model.global_batch_size if described else cfg.data.global_batch_size)
        seq = planner.get("seq_len") or (model.max_seq_len if described else cfg.data.seq_len)
        precision = str(planner.precision)
        if precision == "auto":
            precision = "mixed" if hardware.device == "cuda" else "fp32"
        if precision not in PRECISIONS:
            raise PlanError(f"planner.precision={planner.precision}: use auto, fp32 or mixed")
        recompute = str(planner.recompute)
        options = {
            "none": ("none",),
            "selective": ("selective",),
            "full": ("full",),
            "any": ("none", "selective", "full"),
        }
        if recompute not in options:
            raise PlanError(f"planner.recompute={recompute}: use none, selective, full or any")
        fraction = float(planner.memory_fraction)
        if not 0 < fraction <= 1:
            raise PlanError(f"planner.memory_fraction={fraction}: must be in (0, 1]")
        return cls(
            global_batch_size=int(gbs),
            seq_len=int(seq),
            precision=precision,
            memory_fraction=fraction,
            recompute=options[recompute],
        )


def refuse_to_build(**kwargs: Any) -> None:
    """``_target_`` of planner-only model descriptions: building one here is a mistake, said clearly."""
    name = kwargs.get("name", "this model")
    raise PlanError(
        f"model={name} is a description for the planner (python -m parallel.plan model={name} ...), "
        "too big to build here; train a buildable model such as model=gpt_small"
    )
