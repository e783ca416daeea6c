"""GPU smoke test: a ~1B- (or ~3B-) parameter Llama in bf16-mixed (and/or fp8) with regional compile and selective
activation checkpointing, under parallel=single and parallel=fsdp, through train.py as a user runs it.

On a GPU machine (one GPU: under 5 minutes per size and precision; every visible GPU is used by the fsdp run):

    python benchmarks/gpu_smoke.py
    python benchmarks/gpu_smoke.py --size 1b,3b --precision bf16-mixed,fp8   # float8 needs compute capability 8.9+

prints, per run, tokens/s, MFU, peak memory, compile time and, with more than one GPU, the NCCL transport
the fsdp run's ranks connected over (from NCCL_DEBUG=INFO: NVLS, P2P/IPC, SHM, NET/IB ...). Without a GPU it
runs a reduced configuration on CPU (llama_debug, gloo, 2 ranks for fsdp) through the same code, so the
script itself is exercised by the test suite (``--tiny``: a few steps, no compile).

    python benchmarks/gpu_smoke.py --steps 30 --out smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: ~1.0B parameters: 16 blocks of d_model 2048 (GQA 32/8 heads, SwiGLU 8192); byte vocabulary (the corpus)
GPU_MODEL = (
    "model=llama_debug",
    "model.name=llama_1b",
    "model.n_layers=16",
    "model.d_model=2048",
    "model.n_heads=32",
    "model.n_kv_heads=8",
    "model.d_ff=8192",
    "data.seq_len=2048",
    "data.global_batch_size=8",
    "topology=gpu_node",
    "topology.device=cuda",
)
#: the sizes --size picks on a GPU: the blocks of GPU_MODEL replaced (3B: Llama 3.2 3B's 28 x 3072, 24/8 heads)
GPU_SIZES = {
    "1b": (),
    "3b": ("model.name=llama_3b", "model.n_layers=28", "model.d_model=3072", "model.n_heads=24", "model.d_ff=8192"),
}
CPU_MODEL = ("model=llama_debug", "data.seq_len=64", "data.global_batch_size=8", "topology.device=cpu")
COMMON = (
    "trainer.activation_checkpointing=selective",
    "trainer.checkpoint_every=0",
    "logger=none",
)
NCCL_PATH = re.compile(r"(via (?:P2P/\S+|SHM\S*|NET/\S+)|NVLS \w+|CollNet \w+|nvls)", re.I)


def cuda_devices() -> int:
    """Visible CUDA devices, asked of torch in a child process (this script imports no torch itself)."""
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"],
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip() or 0)


def run(name: str, overrides: list[str], *, run_dir: Path, env: dict[str, str], **labels: str) -> dict:
    t0 = time.time()
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT)
    wall = time.time() - t0
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {' '.join(cmd)}\n{output[-4000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    logs = output + "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("rank*.log")))
    paths = sorted({m.group(1) for m in NCCL_PATH.finditer(logs)})
    return {
        "run": name,
        **labels,
        "command": "python train.py " + " ".join(overrides),
        "world_size": summary["layout"]["world_size"],
        "final_loss": summary["final_loss"],
        "first_loss": summary["first_loss"],
        "tokens_per_s": summary["tokens_per_s"],
        "mfu": summary.get("mfu"),
        "device_peak_tflops": summary.get("device_peak_tflops"),
        "device_peak_source": summary.get("device_peak_source"),
        "peak_memory_bytes_max": summary["peak_memory_bytes_max"],
        "peak_saved_activation_bytes_max": summary.get("peak_saved_activation_bytes_max"),
        "compile_time_s": summary.get("compile_time_s"),
        "first_step_time_s": summary.get("first_step_time_s"),
        "median_step_time_s": summary["median_step_time_s"],
        "nccl_path": paths,
        "wall_s": wall,
    }


def strategy_runs(base: list[str], *, fsdp_ranks: int) -> dict[str, list[str]]:
    """The two runs of one size and precision: one process, and FSDP2 over ``fsdp_ranks`` (8 samples each)."""
    fsdp = ["parallel=fsdp", f"dp.size={fsdp_ranks}", f"data.global_batch_size={8 * fsdp_ranks}"]
    return {"single": [*base, "parallel=single"], "fsdp": [*base, *fsdp]}


def describe(r: dict, *, nccl: bool) -> str:
    """One result as the printed line."""
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
    compile_s = f"{r['compile_time_s']:.1f} s" if r["compile_time_s"] is not None else "off"
    return (
        f"{r['size']} {r['precision']:>10} {r['run']:>6} x{r['world_size']}: {r['tokens_per_s']:,.0f} tokens/s, "
        f"MFU {mfu} (peak {r['device_peak_tflops']:.4g} TFLOP/s/device, {r['device_peak_source']}), "
        f"peak memory {r['peak_memory_bytes_max'] / 2**30:.2f} GiB, compile {compile_s}, "
        f"loss {r['first_loss']:.3f} -> {r['final_loss']:.3f}, {r['wall_s']:.0f} s"
        + (f", NCCL: {', '.join(r['nccl_path']) or 'not reported'}" if nccl else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="CPU check of this script: 3 steps, no compile")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument(
        "--precision", default="bf16-mixed", help="comma-separated trainer.precision values (bf16-mixed, fp8)"
    )
    parser.add_argument("--size", default="1b", help=f"comma-separated GPU model sizes ({', '.join(GPU_SIZES)})")
    args = parser.parse_args(argv)
    precisions = args.precision.split(",")
    sizes = args.size.split(",")
    unknown = [s for s in sizes if s not in GPU_SIZES]
    if unknown:
        parser.error(f"--size {args.size}: unknown size(s) {unknown}; use {', '.join(GPU_SIZES)}")

    gpus = 0 if args.tiny else cuda_devices()  # --tiny runs on CPU wherever it runs: no child importing torch to ask
    on_gpu = gpus > 0
    steps = 3 if args.tiny else args.steps
    sizes = sizes if on_gpu else ["debug"]
    fsdp_ranks = max(gpus, 1) if on_gpu else 2
    nccl_env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"} if on_gpu and gpus > 1 else {}
    where = f"{gpus} CUDA device(s)" if on_gpu else "CPU (reduced configuration: llama_debug, gloo)"
    print(
        f"gpu_smoke on {where}: {', '.join(precisions)}, selective AC, compile={not args.tiny}, {steps} steps",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu_smoke_") as tmp:
        for size in sizes:
            model = [*GPU_MODEL, *GPU_SIZES[size]] if on_gpu else list(CPU_MODEL)
            for precision in precisions:
                base = [*model, f"trainer.precision={precision}", *COMMON, f"trainer.max_steps={steps}"]
                base += [f"trainer.log_every={max(1, steps // 4)}", f"trainer.compile={str(not args.tiny).lower()}"]
                for name, overrides in strategy_runs(base, fsdp_ranks=fsdp_ranks).items():
                    env = nccl_env if name == "fsdp" else {}
                    run_dir = Path(tmp) / f"{size}-{precision}-{name}"
                    results.append(run(name, overrides, run_dir=run_dir, env=env, precision=precision, size=size))
                    print(describe(results[-1], nccl=bool(env)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
