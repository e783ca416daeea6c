"""What every hand-written baseline loop (``benchmarks/bare_*.py``) shares with ``python train.py``'s defaults.

The model (``--model``: gpt_small, llama_debug, qwen3_debug or the MoEs qwen3_moe_debug and deepseek_v3_debug, each its
``conf/model/<name>.yaml`` shape), the byte data (``TextCorpus``, the same global batch per step
as meshtrain's), AdamW with ``conf/optim/adamw.yaml``'s lr and betas, clipping at ``trainer.grad_clip``'s 1.0,
one thread per rank, and the timing each loop prints: one JSON line with the median steady-state tokens/s
(steps 3 on, as meshtrain's summary), each rank's median process CPU seconds per step, the time from launch
to the end of step 1, and the step-1 loss averaged over the ranks that compute one (meshtrain's
``first_loss``); and the end-to-end rate of steps 2 on (every second of the loop after step 1, logging
included: meshtrain's steady median times the step alone). Plain torch only: no meshtrain parallel or trainer
code besides the model class and the data source.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models.deepseek_v3.model import DeepseekV3
from models.gpt.model import GPT
from models.llama.model import Llama
from models.qwen3.model import Qwen3
from models.qwen3_moe.model import Qwen3Moe
from trainer.data.datasets import TextCorpus

VOCAB = 256
#: gpt_small's shape
SHAPE = {"vocab_size": VOCAB, "n_layers": 4, "d_model": 128, "n_heads": 4, "d_ff": 512}
_DECODER = {"vocab_size": VOCAB, "n_layers": 4, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 384}
_QWEN3 = {**_DECODER, "head_dim": 64, "rope_theta": 1000000.0, "norm_eps": 1e-6}
#: ``--model``: each name's class and its conf/model/<name>.yaml shape (max_seq_len is ``--seq``)
MODELS: dict[str, tuple[type[nn.Module], dict]] = {
    "gpt_small": (GPT, SHAPE),
    "llama_debug": (Llama, {**_DECODER, "rope_theta": 10000.0}),
    "qwen3_debug": (Qwen3, _QWEN3),
    # 8 experts of width 128, top-2, the last layer dense, the load-balancing loss's gradient at 0.001
    "qwen3_moe_debug": (
        Qwen3Moe,
        {**_QWEN3, "n_experts": 8, "top_k": 2, "moe_d_ff": 128, "mlp_only_layers": [3], "router_aux_loss_coef": 0.001},
    ),
    # MLA (q rank 48, kv rank 32), layer 0 dense, 8 experts of width 32 in 4 groups (2 picked, then top-2), 1 shared,
    # sigmoid scores x 2.5, the routing bias moved every step, the sequence-wise balance loss at 0.0001
    "deepseek_v3_debug": (
        DeepseekV3,
        {
            "vocab_size": VOCAB,
            "n_layers": 4,
            "d_model": 64,
            "n_heads": 4,
            "q_lora_rank": 48,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "d_ff": 192,
            "first_k_dense_replace": 1,
            "n_experts": 8,
            "top_k": 2,
            "moe_d_ff": 32,
            "n_shared_experts": 1,
            "n_group": 4,
            "topk_group": 2,
            "route_scale": 2.5,
            "bias_update_rate": 0.001,
            "seq_aux_loss_coef": 0.0001,
        },
    ),  # fmt: skip
}
#: steps whose times are left out of the median (meshtrain's StepStats warm-up)
WARMUP_STEPS = 2


def parse_args(**defaults) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--launch-time", type=float, default=time.time())
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank, NCCL")
    ap.add_argument("--model", choices=list(MODELS), default="gpt_small")
    for key, value in defaults.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    return ap.parse_args()


def init(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """One thread, the process group torchrun set up (gloo on CPU; NCCL on CUDA, this rank's GPU the
    ``LOCAL_RANK``-th); returns (rank, world size, device)."""
    torch.set_num_threads(1)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def build_model(args: argparse.Namespace, *, device: torch.device) -> nn.Module:
    """``--model``, seeded as meshtrain's build (``trainer.seed`` 0), with its default initialisation."""
    cls, shape = MODELS[args.model]
    torch.manual_seed(0)
    return cls(**shape, max_seq_len=args.seq).to(device)


def corpus(args: argparse.Namespace) -> TextCorpus:
    data = TextCorpus(
        global_batch_size=args.batch, seq_len=args.seq, cache_dir=os.path.expanduser("~/.cache/meshtrain")
    )
    data.prepare()
    return data


def adamw(params: Iterable[torch.nn.Parameter], args: argparse.Namespace) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)


def replica_rows(*, replica: int, replicas: int, batch: int) -> slice:
    """This data-parallel replica's contiguous share of the global batch (as meshtrain's ``local_batch``)."""
    n = batch // replicas
    return slice(replica * n, (replica + 1) * n)


def torch_clip(params: Iterable[torch.nn.Parameter], max_norm: float) -> Callable[[], torch.Tensor]:
    """``torch.nn.utils.clip_grad_norm_`` over ``params`` (all plain tensors, or all DTensors of one mesh)."""
    params = list(params)
    return lambda: torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


def module_train_step(
    *,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    data: TextCorpus,
    rows: slice,
    clip: Callable[[], object],
    device: torch.device,
) -> Callable[[int], torch.Tensor]:
    """The step of a loop that runs one whole (wrapped) module: this rank's rows, forward, loss, backward,
    ``clip()``, update."""

    def train_step(step: int) -> torch.Tensor:
        x, y = (t[rows].to(device) for t in data.global_batch(step))
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        clip()
        opt.step()
        return loss.detach()

    return train_step


def run_replicated(
    args: argparse.Namespace, model: torch.nn.Module, *, rank: int, world: int, device: torch.device
) -> None:
    """The whole loop of a module replicated over every rank (DDP, FSDP2): each replica its contiguous rows,
    AdamW, torch's ``clip_grad_norm_``, timed; rank 0 reports."""
    opt = adamw(model.parameters(), args)
    step = module_train_step(
        model=model,
        opt=opt,
        data=corpus(args),
        rows=replica_rows(replica=rank, replicas=world, batch=args.batch),
        clip=torch_clip(model.parameters(), args.clip),
        device=device,
    )
    timed_loop(args, step, report=rank == 0)


def pipeline_stage_module(args: argparse.Namespace, *, stage: int, stages: int, device: torch.device) -> nn.Module:
    """The whole model with what other stages own removed: an equal share of the blocks, the embeddings on
    the first stage, the final norm and head on the last (the model's forward skips parts set to None)."""
    model = build_model(args, device=device)
    per = len(model.layers) // stages
    for key in list(model.layers.keys()):
        if not stage * per <= int(key) < (stage + 1) * per:
            del model.layers[key]
    if stage > 0:
        model.tok_embeddings = None
        if hasattr(model, "pos_embeddings"):  # GPT's learned positions (the decoders rotate instead)
            model.pos_embeddings = None
    if stage < stages - 1:
        model.norm = model.output = None
    return model


def pipeline_train_step(
    *,
    schedule,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    data: TextCorpus,
    rows: slice,
    first: bool,
    last: bool,
    max_norm: float,
    device: torch.device,
) -> Callable[[int], torch.Tensor | None]:
    """The step of a loop around a torch pipelining schedule: the first stage feeds inputs, the last the
    targets; the global norm sums every rank's local squares (stages hold disjoint parameters and, under
    FSDP2, each replica a disjoint shard of them)."""

    def train_step(step: int) -> torch.Tensor | None:
        x, y = (t[rows].to(device) for t in data.global_batch(step))
        opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        sq = torch.nn.utils.get_total_norm(local, foreach=True).double() ** 2
        dist.all_reduce(sq)
        clip_by_squared_norm_(grads, sq, max_norm)
        opt.step()
        return torch.stack(losses).sum().detach() if last else None

    return train_step


def microbatch_loss(micro_batches: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross-entropy divided by the micro-batch count, so with ``scale_grads=False`` the accumulated
    gradient is the gradient of the mean loss (meshtrain's pipeline engine does the same)."""

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) / micro_batches

    return loss_fn


def timed_loop(args: argparse.Namespace, train_step: Callable[[int], torch.Tensor | None], *, report: bool) -> None:
    """Run ``train_step(step)`` (batch, forward, backward, clip, update; returns the loss or None) for
    ``args.steps`` steps on every rank; the ``report`` rank prints the JSON line, with every rank's median
    process CPU seconds per steady step (as meshtrain's summary). On CUDA each step ends with a
    synchronisation, so its time is the GPU's (as meshtrain's loop times it)."""
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    times, cpu, first_step_end, first_loss = [], [], None, None
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = train_step(step)
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if first_step_end is None:
            first_step_end = time.time()
            first_loss = mean_loss(loss, device=args.device)
        elif step % 10 == 0 and loss is not None:
            loss.item()
    after_first = time.perf_counter() - started - times[0]
    cpu_per_rank: list[float | None] = [None] * dist.get_world_size()
    dist.all_gather_object(cpu_per_rank, statistics.median(cpu[WARMUP_STEPS:]))
    if report:
        median = statistics.median(times[WARMUP_STEPS:])
        result = {
            "tokens_per_s": args.batch * args.seq / median,
            "median_step_time_s": median,
            "median_step_cpu_s_per_rank": cpu_per_rank,
            "launch_to_first_step_s": first_step_end - args.launch_time,
            "first_step_s": times[0],
            "end_to_end_tokens_per_s": args.batch * args.seq * (args.steps - 1) / after_first,
            "first_loss": first_loss,
        }
        print(json.dumps(result), flush=True)


def close() -> None:
    """After the caller dropped its model and optimizer: freeing a DDP module while the group is torn down
    can hang (docs/stack.md, "Teardown deadlock"), so collect first."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def mean_loss(loss: torch.Tensor | None, *, device: str = "cpu") -> float:
    """The loss averaged over the ranks that hold one (all ranks: a collective; on ``device``, NCCL's)."""
    acc = torch.tensor([0.0, 0.0], dtype=torch.float64, device=device)
    if loss is not None:
        acc += torch.tensor([float(loss), 1.0], dtype=torch.float64, device=device)
    dist.all_reduce(acc)
    return float(acc[0] / acc[1])


def clip_by_squared_norm_(grads: list[torch.Tensor], squared_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale local gradient storage (plain tensors or DTensors' local shards) by torch's clip coefficient for
    the global norm ``sqrt(squared_norm)``; returns the norm."""
    norm = squared_norm.sqrt().float()
    coef = float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    if coef < 1.0:
        torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads], coef)
    return norm
