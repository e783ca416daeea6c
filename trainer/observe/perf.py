"""Per-step performance measurements every strategy gets: MFU, memory, saved activations, compile time, profiles.

- **MFU** (model FLOPs utilisation, PaLM's definition): the model's training FLOPs per step (forward +
  backward, attention included, recomputation *not* counted: ``ModelShape.training_flops_per_token`` times the
  tokens of the global batch; the formulas live with the model family, ``models/shape.py``) over the step time and the peak FLOP/s of all devices of the run. The peak of
  one device is ``topology.device_peak_tflops``; when null, a known GPU's dense bf16 peak, else a matmul in
  the compute dtype measured on rank 0 at the first logged step (CPU). Models the FLOP formula cannot describe (the CNN)
  get no ``mfu``.
- **Memory**: CUDA allocated and reserved bytes (the maximum over ranks at the logged step); on CPU the
  resident set size. ``peak_memory_bytes_per_rank`` (the run's peak) stays in the summary as before.
- **Saved activations**: ``parallel/foundation/activations.py`` counts the bytes autograd keeps for backward;
  each measured step reports the largest per-step peak over ranks, the summary the run's peak per rank. Only
  the measured steps are counted (the loop passes ``measure``: logged steps, the first of each window of
  ``trainer.measure_every``): the hooks run Python for every saved tensor, about 2% of a gpt_small step on this
  machine, and every step of a run has the same shapes, so those steps measure the same peak.
- **Compile**: ``compile_time_s`` (torch's own compile timers: dynamo, AOTAutograd, inductor, forward and
  backward graphs) next to ``first_step_time_s`` and the steady median step time.
- **Profiling**: ``trainer.profile_steps=[a, b]`` writes ``profile/rank<r>.trace.json`` (torch.profiler,
  Chrome trace format) for steps a..b on every rank, and on CUDA ``profile/rank<r>_memory.pickle`` (the CUDA
  caching allocator's memory snapshot, viewable at pytorch.org/memory_viz).
"""

from __future__ import annotations

import os
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parallel.assembly.context import WorkerContext
from parallel.foundation.activations import SavedActivationMeter
from parallel.foundation.precision import compute_dtype

#: dense bf16 peak TFLOP/s of common GPUs (vendor data sheets, without sparsity), matched on the device name
KNOWN_BF16_PEAK_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 80GB HBM3": 989.4,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
}


def model_flops_per_token(model: Any, *, seq_len: int) -> float | None:
    """Training FLOPs per token of the model (its typed config; no recomputation), or None if it has no formula."""
    from models.registry import model_shape
    from models.shape import PlanError

    try:
        shape = model_shape(model)  # the family's formulas (models/registry.py)
    except PlanError:
        return None
    return float(shape.training_flops_per_token(seq_len))


def measure_matmul_tflops(*, dtype: torch.dtype, device: torch.device, seconds: float = 0.2) -> float:
    """Best sustained TFLOP/s of a square matmul in ``dtype`` on ``device`` (this rank's threads)."""
    n = 4096 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    deadline = time.perf_counter() + seconds
    reps = 0
    while reps < 3 or time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2 * n**3 / best / 1e12


def device_peak(cfg: Any, device: torch.device) -> tuple[float, str]:
    """(peak TFLOP/s of one device, where the number comes from)."""
    given = cfg.topology.get("device_peak_tflops")
    if given:
        return float(given), "topology.device_peak_tflops"
    dtype = compute_dtype(str(cfg.trainer.precision))
    if device.type == "cuda" and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        for key, value in KNOWN_BF16_PEAK_TFLOPS.items():
            if key in name:
                return value, f"{name} bf16 data sheet"
    return measure_matmul_tflops(dtype=dtype, device=device), f"measured {str(dtype).removeprefix('torch.')} matmul"


def memory_now(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "memory_allocated_bytes": float(torch.cuda.memory_allocated(device)),
            "memory_reserved_bytes": float(torch.cuda.memory_reserved(device)),
        }
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        from trainer.observe.memory import peak_memory_bytes

        rss = peak_memory_bytes(device)
    return {"memory_rss_bytes": float(rss)}


def compile_seconds() -> float:
    """Seconds torch spent compiling so far in this process (dynamo frames, including the AOT and inductor
    forward compiles they trigger, plus lazily compiled backward graphs)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # pragma: no cover - torch without dynamo
        return 0.0
    total = 0.0
    for key, times in compilation_time_metrics.items():
        if key.endswith("compile_inner") or "bw_compiler" in key:
            total += sum(times)
    return total


class StepProfiler:
    """torch.profiler over steps [a, b] on this rank; a CUDA memory snapshot as well on CUDA."""

    def __init__(self, *, ctx: WorkerContext, steps: list[int]):
        self.ctx = ctx
        self.first, self.last = int(steps[0]), int(steps[1])
        self.folder = ctx.run_dir / "profile"
        self._prof: Any = None
        self.files: list[Path] = []

    def begin(self, step: int) -> None:
        if step != self.first:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.ctx.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._prof = profile(activities=activities, record_shapes=True, profile_memory=True)
        self._prof.__enter__()

    def end(self, step: int, *, force: bool = False) -> None:
        if self._prof is None or (step != self.last and not force):
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / f"rank{self.ctx.rank}.trace.json"
        prof.export_chrome_trace(str(trace))
        self.files.append(trace)
        if self.ctx.device.type == "cuda":
            snap = self.folder / f"rank{self.ctx.rank}_memory.pickle"
            torch.cuda.memory._dump_snapshot(str(snap))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.files.append(snap)
        self.ctx.log.info("profile of steps %d-%d: %s", self.first, step, ", ".join(map(str, self.files)))


class StepInstruments:
    """What the loop measures around every step besides time: see the module docstring."""

    def __init__(self, *, ctx: WorkerContext, tokens_per_step: int):
        self.ctx = ctx
        cfg = ctx.cfg
        self.meter = SavedActivationMeter()
        per_token = model_flops_per_token(ctx.run.model, seq_len=ctx.run.batch.seq_len)
        self.flops_per_token = per_token
        self.flops_per_step = per_token * tokens_per_step if per_token is not None else None
        self.peak_tflops: float | None = None
        self.peak_source: str | None = None
        steps = list(cfg.trainer.get("profile_steps") or [])
        self.profiler = StepProfiler(ctx=ctx, steps=steps) if steps else None
        self.compile = bool(cfg.trainer.get("compile", False))
        self._logged: list[dict[str, float]] = []
        self._compile_s = 0.0

    @contextmanager
    def step(self, step: int, *, measure: bool = True):
        """Around one step's forward and backward; ``measure``: count its saved activations (measured steps)."""
        if self.profiler is not None:
            self.profiler.begin(step)
        try:
            with self.meter.step() if measure else nullcontext():
                yield
        finally:
            if self.profiler is not None:
                self.profiler.end(step)

    def logged(self, step: int, step_time_s: float, *, measured: bool = True) -> dict[str, float]:
        """Metrics of a logged step (collective: every rank calls it at the same steps); ``measured``: its saved
        activations were counted (``trainer.measure_every``), so their peak is reported."""
        mem = memory_now(self.ctx.device)
        keys = sorted(mem)
        vec = torch.tensor([mem[k] for k in keys] + [float(self.meter.peak)], dtype=torch.float64)
        if self.ctx.world_size > 1:
            vec = vec.to(self.ctx.device)
            dist.all_reduce(vec, op=dist.ReduceOp.MAX)
        values = vec.tolist()
        out: dict[str, float] = dict(zip(keys, values[:-1]))
        if measured:
            out["saved_activation_bytes"] = values[-1]
        if self.flops_per_step is not None and self.ctx.rank == 0 and self.peak_source is None:
            # measured (CPU) at the first logged step, after the first step's time is taken: a matmul
            # benchmark before the loop would delay the first step
            self.peak_tflops, self.peak_source = device_peak(self.ctx.cfg, self.ctx.device)
        if self.flops_per_step is not None and self.peak_tflops:
            achieved = self.flops_per_step / max(step_time_s, 1e-12)
            out["model_tflops_per_s"] = achieved / 1e12
            out["mfu"] = achieved / (self.ctx.world_size * self.peak_tflops * 1e12)
        self._logged.append({"step": step, **out})
        return out

    def summary(self, *, step_times: list[float]) -> dict[str, Any]:
        """Summary entries (collective: gathers per-rank peaks and profile files)."""
        if self.profiler is not None:
            self.profiler.end(-1, force=True)
        mine = {
            "saved": self.meter.run_peak,
            "dtypes": dict(self.meter.bytes_by_dtype),
            "files": [str(p) for p in (self.profiler.files if self.profiler else [])],
        }
        everyone = [mine]
        if self.ctx.world_size > 1:
            everyone = [None] * self.ctx.world_size
            dist.all_gather_object(everyone, mine)
        steady = [r for r in self._logged if r["step"] > 2] or self._logged

        def med(key: str) -> float | None:
            vals = [r[key] for r in steady if key in r]
            return statistics.median(vals) if vals else None

        saved = [int(e["saved"]) for e in everyone]
        out: dict[str, Any] = {
            "mfu": med("mfu"),
            "model_tflops_per_s": med("model_tflops_per_s"),
            "model_flops_per_token": self.flops_per_token,
            "device_peak_tflops": self.peak_tflops,
            "device_peak_source": self.peak_source,
            "precision": self.ctx.run.compose.precision,
            "activation_checkpointing": self.ctx.run.compose.activation_checkpointing,
            "ac_every": self.ctx.run.compose.ac_every,
            "compile": self.compile,
            "peak_saved_activation_bytes_per_rank": saved,
            "peak_saved_activation_bytes_max": max(saved) if saved else None,
            # share of the bytes saved for backward in bf16, per rank: 0 in fp32, most of them in bf16 modes
            "saved_activation_bf16_share_per_rank": [
                e["dtypes"].get("bfloat16", 0) / max(1, sum(e["dtypes"].values())) for e in everyone
            ],
            "first_step_time_s": step_times[0] if step_times else None,
        }
        for key in ("memory_allocated_bytes", "memory_reserved_bytes", "memory_rss_bytes"):
            if any(key in r for r in steady):
                out[key] = med(key)
        if self.compile:
            out["compile_time_s"] = compile_seconds()
        files = [f for e in everyone for f in e["files"]]
        if files:
            out["profile_files"] = files
        return out
