"""torchtitan's side of ``benchmarks/vs_torchtitan.py``: torchtitan 0.3.0's own ``Trainer`` (its train step, loss,
clipping, optimizer container, metrics and logging), run under ``torchrun`` in torchtitan's own environment (built by
``benchmarks/torchtitan_env.py``, patched for CPU by ``benchmarks/torchtitan-0.3.0-cpu.diff``).

The model comes from torchtitan's registry (``--pair``: llama3 ``debugmodel``; qwen3 ``debugmodel_moe`` cut to
``MOE`` below); the data are the harness's global batches (``--batches``, a ``torch.save`` of meshtrain's byte
corpus, step by step), each batch rank its contiguous rows as meshtrain's ``local_batch``; the optimizer is
torchtitan's ``default_adamw`` at meshtrain's lr, betas, weight decay and schedule (``--lr``, linear warm-up then
linear decay to 0), clipping at 1.0, fp32, no activation checkpointing, no compile, no checkpoints, no validation.
Each rank notes its step ends with ``benchmarks/step_clock.StepClock`` (``--clock``). ``--count`` prints the
registry model's parameter count as one JSON line instead of training.

Not imported by meshtrain; it imports torchtitan.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402
from torchtitan.components.loss import CrossEntropyLoss  # noqa: E402
from torchtitan.components.metrics import MetricsProcessor  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.components.validate import Validator  # noqa: E402
from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig  # noqa: E402
from torchtitan.models.common.config_utils import decoder_vocab_size  # noqa: E402
from torchtitan.tools.logging import init_logger  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from benchmarks.step_clock import StepClock  # noqa: E402

MOE = {"n_layers": 4, "num_experts": 8, "top_k": 2}
"""qwen3 ``debugmodel_moe`` (8 layers, 64 experts, top-8) cut to fit two CPU cores; its widths kept."""


class ReplayTokenizer(BaseTokenizer):
    """No text: the batches arrive as token ids."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 2048

    def __init__(self, config: Config, **kwargs: Any):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError("the benchmark's batches are token ids already")

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("the benchmark's batches are token ids already")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class ReplayBatches(BaseDataLoader):
    """The harness's global batches, step by step: this batch rank's contiguous rows (meshtrain's ``local_batch``),
    in chunks of ``local_batch_size`` (a pipeline's micro-batches)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        path: str = ""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, local_batch_size: int, **kwargs: Any):
        batches = torch.load(config.path)
        self.inputs, self.targets = batches["inputs"], batches["targets"]
        rows = self.inputs.shape[1] // dp_world_size
        self.rows = slice(dp_rank * rows, (dp_rank + 1) * rows)
        self.chunk = local_batch_size

    def __iter__(self):
        for x, y in zip(self.inputs, self.targets):
            x, y = x[self.rows], y[self.rows]
            for start in range(0, x.shape[0], self.chunk):
                yield {"input": x[start : start + self.chunk]}, y[start : start + self.chunk]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class ClockedTrainer(Trainer):
    """torchtitan's Trainer, its step end noted (and the loss it logged) after each ``train_step``."""

    def __init__(self, config: Trainer.Config, *, clock: StepClock, profile_step: int = 0):
        super().__init__(config)
        self.clock = clock
        self.profile_step = profile_step
        self.logged_loss: float | None = None
        log = self.metrics_processor.log

        def keep_loss(step: int, global_avg_loss: float, *args: Any, **kwargs: Any) -> None:
            self.logged_loss = float(global_avg_loss)
            log(step, global_avg_loss, *args, **kwargs)

        self.metrics_processor.log = keep_loss

    def train_step(self, data_iterator):
        self.logged_loss = None
        if self.step == self.profile_step:  # one step's ops and collectives: <clock>/profile/rank<r>.trace.json
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                super().train_step(data_iterator)
            (self.clock.out / "profile").mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(self.clock.out / "profile" / f"rank{self.clock.rank}.trace.json"))
        else:
            super().train_step(data_iterator)
        holds_loss = not self.parallel_dims.pp_enabled or self.pp_has_last_stage  # earlier stages log -1
        self.clock.mark(self.step, self.logged_loss if holds_loss else None)


def model_spec(pair: str):
    """torchtitan's registry entry for the pair, attention through SDPA (the diff's backend: FlexAttention has no
    backward on CPU)."""
    if pair == "ep":
        from torchtitan.models.common.rope import CosSinRoPE
        from torchtitan.models.qwen3 import _build_qwen3_moe_layers, model_registry

        spec = model_registry("debugmodel_moe", attn_backend="sdpa")
        cfg = spec.model
        first = cfg.layers[0]
        head_dim = first.attention.head_dim
        cfg.layers = _build_qwen3_moe_layers(
            n_layers=MOE["n_layers"],
            dim=cfg.dim,
            n_heads=first.attention.n_heads,
            n_kv_heads=first.attention.n_kv_heads,
            head_dim=head_dim,
            moe_hidden_dim=first.moe.routed_experts.inner_experts.hidden_dim,
            num_experts=MOE["num_experts"],
            top_k=MOE["top_k"],
            attn_backend="sdpa",
            moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=4096, theta=1000000.0),
        )
        for layer in cfg.layers:
            layer.moe.load_balance_coeff = None  # balancing off on both sides
        return spec
    from torchtitan.models.llama3 import model_registry

    return model_registry("debugmodel", attn_backend="sdpa")


def parallelism(pair: str, *, micro_batches: int, batch: int) -> ParallelismConfig:
    if pair == "tp":
        return ParallelismConfig(data_parallel_shard_degree=1, tensor_parallel_degree=2, spmd_backend="partial_dtensor")
    if pair == "pp":
        return ParallelismConfig(
            data_parallel_shard_degree=1,
            pipeline_parallel_degree=2,
            pipeline_parallel_schedule="1F1B",
            pipeline_parallel_microbatch_size=batch // micro_batches,
            spmd_backend="partial_dtensor",
        )
    if pair == "ep":
        return ParallelismConfig(data_parallel_shard_degree=2, expert_parallel_degree=2, spmd_backend="partial_dtensor")
    return ParallelismConfig(data_parallel_shard_degree=2, spmd_backend="partial_dtensor")


def trainer_config(args: argparse.Namespace) -> Trainer.Config:
    spec = model_spec(args.pair)
    replicas = 1 if args.pair in ("tp", "pp") else 2
    return Trainer.Config(
        model_spec=spec,
        dump_folder=args.dump,
        loss=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec)),
        tokenizer=ReplayTokenizer.Config(vocab_size=decoder_vocab_size(spec)),
        dataloader=ReplayBatches.Config(path=args.batches),
        optimizer=default_adamw(lr=args.lr, weight_decay=args.weight_decay),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=args.warmup, decay_ratio=None, decay_type="linear", min_lr_factor=0.0
        ),
        training=TrainingConfig(
            local_batch_size=args.batch // replicas,
            seq_len=args.seq,
            steps=args.steps,
            max_norm=1.0,
            mixed_precision_param="float32",
            disable_cuda_graphs=True,
        ),
        metrics=MetricsProcessor.Config(log_freq=args.log_every),
        parallelism=parallelism(args.pair, micro_batches=args.micro_batches, batch=args.batch),
        activation_checkpoint=None,
        validator=Validator.Config(enable=False),
        debug=DebugConfig(seed=0),  # the same initial weights every run (meshtrain's trainer.seed is 0 too)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pair", choices=("fsdp", "tp", "pp", "ep"), required=True)
    if "--count" in sys.argv:  # the parameter count only: one JSON line
        print(json.dumps({"parameters": count_parameters(ap.parse_known_args()[0].pair)}))
        return 0
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--log-every", type=int, required=True)
    ap.add_argument("--batches", required=True, help="torch.save({'inputs', 'targets'}) of [steps, batch, seq]")
    ap.add_argument("--clock", required=True, help="folder for each rank's step ends")
    ap.add_argument("--dump", required=True, help="torchtitan's dump folder")
    ap.add_argument("--profile-step", type=int, default=0, help="torch.profiler trace of this step (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    init_logger()  # torchtitan's console log, as its train.py sets it up
    trainer = ClockedTrainer(trainer_config(args), clock=StepClock(args.clock), profile_step=args.profile_step)
    try:
        trainer.train()
    finally:
        trainer.close()
    trainer.clock.write()
    del trainer
    gc.collect()
    torch.distributed.destroy_process_group()
    return 0


def count_parameters(pair: str) -> int:
    """The registry model's parameters, built on the meta device (no process group)."""
    with torch.device("meta"):
        model = model_spec(pair).model.build()
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    raise SystemExit(main())
