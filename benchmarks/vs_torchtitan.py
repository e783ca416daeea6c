"""meshtrain against torchtitan 0.3.0 itself, pair by pair, on the same model, data, optimizer and layout.

    python benchmarks/vs_torchtitan.py --pairs fsdp,tp,pp,ep --rounds 5
    python benchmarks/vs_torchtitan.py --pairs tp,ep --rounds 5 --log-every 10
    python benchmarks/vs_torchtitan.py --pairs fsdp --rounds 1 --steps 6      # a check that both sides run

torchtitan's side is its own ``Trainer`` (``benchmarks/torchtitan_side.py``) started with ``torchrun``, in an
environment of its own that this script builds the first time (``benchmarks/torchtitan_env.py``: torch 2.13.0 CPU
and torchtitan 0.3.0 from the package index, patched by ``benchmarks/torchtitan-0.3.0-cpu.diff``); meshtrain's is
``python train.py`` as its user starts it. Both: 2 ranks x 1 thread, gloo, fp32, the models of torchtitan's
registry (``MODELS``; the parameter counts are printed and must be equal), meshtrain's byte corpus (the same global
batch each step, each data-parallel rank its contiguous rows), AdamW (lr 8e-4, betas 0.9/0.95, weight decay 0.1:
torchtitan's ``default_adamw``), 2 warm-up steps then linear decay to 0, clipping at 1.0, no activation
checkpointing, compile or checkpoints, the console log every ``--log-every`` steps (meshtrain ``logger=none``: its
console and metrics.jsonl, as torchtitan's console). Rounds alternate which side runs first.

Each side notes every step's end on every rank (``benchmarks/step_clock.py``, a meshtrain callback and a wrapper of
torchtitan's ``train_step``): tokens/s over the steady steps (all the wall clock from the end of step 2 to the last
step, logging included), CPU seconds per steady step summed over the ranks (each process's CPU: its gloo threads
included; what load inflates least), launch to the end of step 1, and the logged losses. Per pair: the median of the
rounds' meshtrain / torchtitan ratios with their range, and each side's medians. A JSON file keeps every round
(``--out``, by default ``outputs/vs_torchtitan/<time>.json``). A benchmark, not a test: CI never installs torchtitan.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.step_clock import WARMUP_STEPS, ratio_table, read_ranks, side_numbers  # noqa: E402

LR, WEIGHT_DECAY, WARMUP = 8e-4, 0.1, 2
"""torchtitan's ``default_adamw`` (llama3 debugmodel's lr) and its debug configs' warm-up; both sides."""


@dataclass(frozen=True)
class Model:
    """A meshtrain ``conf/model`` name (its class ``builder``) and the keys that make it torchtitan's registry model
    (``source``)."""

    conf: str
    builder: str
    keys: dict
    source: str


MODELS = {
    "llama": Model(
        "llama_debug",
        "models.llama.model.Llama",
        {
            "vocab_size": 2048,
            "n_layers": 6,
            "d_model": 256,
            "n_heads": 16,
            "n_kv_heads": 16,
            "d_ff": 768,
            "rope_theta": 500000.0,
            "rope_scaling.factor": 8.0,
        },
        "torchtitan.models.llama3 model_registry('debugmodel'): 6 layers, dim 256, 16 heads, SwiGLU 768, vocab 2048, "
        "rope theta 5e5 with Llama 3.1 scaling",
    ),
    "qwen3_moe": Model(
        "qwen3_moe_debug",
        "models.qwen3_moe.model.Qwen3Moe",
        {
            "vocab_size": 2048,
            "n_layers": 4,
            "d_model": 256,
            "n_heads": 16,
            "n_kv_heads": 8,
            "head_dim": 128,
            "d_ff": 768,
            "moe_d_ff": 768,
            "n_experts": 8,
            "top_k": 2,
            "mlp_only_layers": [],
            "router_aux_loss_coef": 0.0,
        },
        "torchtitan.models.qwen3 model_registry('debugmodel_moe') cut to 4 layers, 8 experts, top-2 "
        "(benchmarks/torchtitan_side.py MOE); dim 256, 16 heads (8 kv) of 128, experts 768 wide; balancing off",
    ),
}


@dataclass(frozen=True)
class Pair:
    describe: str
    model: str
    layout: tuple[str, ...]
    """meshtrain's train.py overrides; torchtitan's side sets the same layout by pair name."""


PAIRS = {
    "fsdp": Pair("FSDP2, dp=2", "llama", ("parallel=fsdp",)),
    "tp": Pair(
        "tensor parallel tp=2, sequence + loss parallel",
        "llama",
        ("parallel=tp", "tp.sequence_parallel=true", "tp.loss_parallel=true"),
    ),
    "pp": Pair("pipeline 1F1B, pp=2, 4 micro-batches", "llama", ("parallel=pp", "pp.micro_batches=4")),
    "ep": Pair(
        "expert parallel dp=2 x ep=2 (FSDP2 over dp)",
        "qwen3_moe",
        ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1"),
    ),
}
MICRO_BATCHES = 4


def parse_pairs(text: str) -> list[str]:
    """``--pairs``: comma-separated names of ``PAIRS``, in the order given; an unknown one is refused."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PAIRS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--pairs {text}: {'unknown ' + ', '.join(unknown) if unknown else 'no pair named'}; "
            f"choose from {','.join(PAIRS)}"
        )
    return list(dict.fromkeys(names))


def meshtrain_overrides(model: Model) -> list[str]:
    def value(v: object) -> str:
        return json.dumps(v) if isinstance(v, list) else str(v)

    return [f"model={model.conf}", *(f"model.{k}={value(v)}" for k, v in model.keys.items())]


def meshtrain_parameters(model: Model, *, seq: int) -> int:
    """meshtrain's model from ``model.keys``, built on the meta device: its parameter count."""
    import torch
    from hydra.utils import get_class

    keys: dict = {}
    for k, v in model.keys.items():
        head, _, tail = k.partition(".")
        if tail:
            keys.setdefault(head, {})[tail] = v
        else:
            keys[k] = v
    with torch.device("meta"):
        net = get_class(model.builder)(**keys, max_seq_len=seq)
    return sum(p.numel() for p in net.parameters())


def write_batches(path: Path, *, steps: int, batch: int, seq: int) -> None:
    """meshtrain's byte corpus, the global batch of each step (``TextCorpus.global_batch``, as meshtrain's loop
    reads it), saved for torchtitan's side."""
    import torch

    from trainer.data.datasets import TextCorpus

    data = TextCorpus(global_batch_size=batch, seq_len=seq, cache_dir=os.path.expanduser("~/.cache/meshtrain"))
    data.prepare()
    pairs = [data.global_batch(step) for step in range(1, steps + 1)]
    torch.save({"inputs": torch.stack([x for x, _ in pairs]), "targets": torch.stack([y for _, y in pairs])}, path)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_side(command: list[str], *, clock: Path, log: Path, tokens: int, env: dict | None = None) -> dict:
    """Start one side, wait, read its ranks' step ends; the run's whole CPU (every process it started) beside."""
    cpu, launch = children_cpu_s(), time.time()
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} ... failed (exit {done.returncode}):\n{log.read_text()[-4000:]}")
    numbers = side_numbers(read_ranks(clock), tokens_per_step=tokens, launch_unix=launch)
    return {**numbers, "run_cpu_s": children_cpu_s() - cpu}


def run_meshtrain(pair: Pair, args: argparse.Namespace, *, work: Path) -> dict:
    clock = work / "clock"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        *pair.layout,
        *meshtrain_overrides(MODELS[pair.model]),
        f"trainer.max_steps={args.steps}",
        "trainer.checkpoint_every=0",
        f"trainer.log_every={args.log_every}",
        f"data.global_batch_size={args.batch}",
        f"data.seq_len={args.seq}",
        f"optim.lr={LR}",
        f"optim.weight_decay={WEIGHT_DECAY}",
        f"optim.warmup_steps={WARMUP}",
        "optim.decay=linear",
        "optim.min_lr_ratio=0.0",
        "logger=none",
        f"trainer.callbacks=[{{_target_:benchmarks.step_clock.StepClock,out:'{clock}'}}]",
        f"hydra.run.dir={work / 'run'}",
        *args.overrides,
    ]
    env = {**os.environ, "WANDB_SILENT": "true"}
    return run_side(command, clock=clock, log=work / "meshtrain.log", tokens=args.batch * args.seq, env=env)


def run_torchtitan(name: str, args: argparse.Namespace, *, python: Path, batches: Path, work: Path) -> dict:
    clock = work / "clock"
    command = [
        str(python),
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        str(ROOT / "benchmarks" / "torchtitan_side.py"),
        f"--pair={name}",
        f"--steps={args.steps}",
        f"--batch={args.batch}",
        f"--seq={args.seq}",
        f"--micro-batches={MICRO_BATCHES}",
        f"--lr={LR}",
        f"--weight-decay={WEIGHT_DECAY}",
        f"--warmup={WARMUP}",
        f"--log-every={args.log_every}",
        f"--batches={batches}",
        f"--clock={clock}",
        f"--dump={work / 'dump'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # torchtitan's environment only (the side script adds the repository for step_clock)
    return run_side(command, clock=clock, log=work / "torchtitan.log", tokens=args.batch * args.seq, env=env)


def torchtitan_parameters(name: str, *, python: Path) -> int:
    out = subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "torchtitan_side.py"), f"--pair={name}", "--count"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"torchtitan's parameter count for {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])["parameters"]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def fmt(spread: tuple[float, float, float], f: str) -> str:
    return f"{spread[0]:{f}} ({spread[1]:{f}}-{spread[2]:{f}})"


def table(results: dict[str, dict]) -> str:
    """The per-pair table: ratios (median, range over rounds) and each side's medians."""
    rows = [
        "| pair | parameters (both) | tokens/s ratio | CPU/step ratio | tokens/s meshtrain | tokens/s torchtitan "
        "| CPU s/step meshtrain | CPU s/step torchtitan | first step meshtrain | first step torchtitan "
        "| loss first -> last, meshtrain | torchtitan |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, r in results.items():
        t, m, tt = r["table"], r["table"]["meshtrain"], r["table"]["torchtitan"]

        def losses(side: dict) -> str:
            if side["first_loss"] is None:
                return "-"
            (s0, l0), (s1, l1) = side["first_loss"], side["last_loss"]
            return f"{l0:.4f} (step {s0}) -> {l1:.4f} (step {s1})"

        rows.append(
            f"| {name} | {r['parameters']:,} | {fmt(t['tokens_per_s_ratio'], '.3f')} | {fmt(t['step_cpu_ratio'], '.3f')} "
            f"| {m['tokens_per_s'][0]:,.0f} | {tt['tokens_per_s'][0]:,.0f} "
            f"| {m['step_cpu_s'][0]:.3f} | {tt['step_cpu_s'][0]:.3f} "
            f"| {m['time_to_first_step_s'][0]:.1f} s | {tt['time_to_first_step_s'][0]:.1f} s "
            f"| {losses(m)} | {losses(tt)} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=parse_pairs, default=list(PAIRS), help=f"comma-separated: {','.join(PAIRS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16, help="steps per side per round (the first 2 are warm-up)")
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--log-every", type=int, default=1, help="both sides log (and measure) every N steps")
    ap.add_argument(
        "--out", type=Path, default=None, help="the JSON result (default outputs/vs_torchtitan/<time>.json)"
    )
    ap.add_argument("--env", type=Path, default=None, help="torchtitan's environment (built there if missing)")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra train.py overrides (meshtrain's side)")
    args = ap.parse_args(argv)
    problems = []
    if args.steps <= WARMUP_STEPS + 1:
        problems.append(f"--steps {args.steps}: the steady rates need more than {WARMUP_STEPS + 1} steps")
    if args.rounds < 1 or args.log_every < 1:
        problems.append(f"--rounds {args.rounds} / --log-every {args.log_every}: both at least 1")
    if args.batch % (2 * MICRO_BATCHES):
        problems.append(f"--batch {args.batch}: a multiple of {2 * MICRO_BATCHES} (2 replicas; pp's micro-batches)")
    if problems:
        ap.error("; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.torchtitan_env import DEFAULT_ENV, ensure_env

    python = ensure_env(args.env or DEFAULT_ENV)
    out = args.out or ROOT / "outputs" / "vs_torchtitan" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
    results: dict[str, dict] = {}
    for name in args.pairs:
        model = MODELS[PAIRS[name].model]
        mine, theirs = meshtrain_parameters(model, seq=args.seq), torchtitan_parameters(name, python=python)
        print(f"{name}: parameters meshtrain {mine:,}, torchtitan {theirs:,} ({model.source})", flush=True)
        if mine != theirs:
            raise SystemExit(f"{name}: the models differ ({mine:,} vs {theirs:,} parameters); fix MODELS")
        results[name] = {"describe": PAIRS[name].describe, "parameters": mine, "model": model.source, "rounds": []}
    load_before, started = loadavg(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vs_torchtitan_") as tmp:
        batches = Path(tmp) / "batches.pt"
        write_batches(batches, steps=args.steps, batch=args.batch, seq=args.seq)
        for r in range(args.rounds):
            for name in args.pairs:
                got = {}
                sides = ("meshtrain", "torchtitan") if r % 2 == 0 else ("torchtitan", "meshtrain")
                for side in sides:
                    work = Path(tempfile.mkdtemp(prefix=f"{name}_{side}_", dir=tmp))
                    if side == "meshtrain":
                        got[side] = run_meshtrain(PAIRS[name], args, work=work)
                    else:
                        got[side] = run_torchtitan(name, args, python=python, batches=batches, work=work)
                results[name]["rounds"].append(got)
                m, t = got["meshtrain"], got["torchtitan"]
                print(
                    f"[round {r + 1}/{args.rounds}, {time.perf_counter() - started:.0f} s] {name}: tokens/s "
                    f"{m['tokens_per_s']:,.0f} / {t['tokens_per_s']:,.0f} = {m['tokens_per_s'] / t['tokens_per_s']:.3f}, "
                    f"CPU s/step {m['step_cpu_s']:.3f} / {t['step_cpu_s']:.3f}, first step "
                    f"{m['time_to_first_step_s']:.1f} s / {t['time_to_first_step_s']:.1f} s (meshtrain / torchtitan; "
                    f"load {loadavg()})",
                    flush=True,
                )
    for r in results.values():
        r["table"] = ratio_table(r["rounds"])
    print(
        f"\n{args.rounds} rounds of {args.steps} steps per side, global batch {args.batch} x {args.seq} tokens, "
        f"2 ranks x 1 thread, gloo, fp32, logging every {args.log_every} step(s); load average before: {load_before}, "
        f"after: {loadavg()}; {time.perf_counter() - started:.0f} s\n"
    )
    print(table(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    shape = {"rounds": args.rounds, "steps": args.steps, "batch": args.batch, "seq": args.seq}
    meta = {**shape, "log_every": args.log_every, "load_before": load_before, "load_after": loadavg()}
    out.write_text(json.dumps({**meta, "overrides": args.overrides, "pairs": results}, indent=1))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
