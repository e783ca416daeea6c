"""Where a step's host work goes, meshtrain against the hand-written loop: op counts and Python time, step by step.

Both sides train ``benchmarks/overhead.py``'s pair (``--strategy``: ddp by default; gpt_small, global batch 32 x 128,
one thread per rank, logging every 10 steps) and profile the steps ``--profile`` names on every rank: torch.profiler's
op counts (``--mode ops``: every op and autograd node recorded, nested ones included, per name) or cProfile's Python
functions (``--mode python``). A profiled window runs from before the step's batch to after its update: on meshtrain's
side ``trainer.callbacks``' ``on_step_start`` to ``on_step_end`` (its logging, on a logged step, included), on the
hand-written side its ``train_step`` (its loop reads the loss with ``.item()`` after it, on every 10th step). Prints,
per side, the ops (or Python seconds) of each profiled step and rank, then the op names whose count per step differs,
logged and unlogged steps apart. The profilers inflate the time they see: the counts, not the times, are the finding.

    python benchmarks/step_ops.py                              # ops of steps 20 (logged) and 21-23, both sides
    python benchmarks/step_ops.py --mode python --rows 30      # cProfile: Python functions by own time
    python benchmarks/step_ops.py --overrides dp.measure_comm=false
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script (the harness, or torchrun's hand-written side)
    sys.path.insert(0, str(ROOT))

#: the steps the loop logs: the first, every 10th (overhead.py's runs log every 10 steps) and the last
LOG_EVERY = 10


class StepProbe:
    """Profiles the steps ``steps`` of this rank (``mode``: ops or python) and writes ``{out}/{rank}.json`` at the
    end. meshtrain loads it as a trainer callback; the hand-written side calls ``start``/``stop`` around a step."""

    def __init__(self, out: str, steps: list[int], mode: str = "ops"):
        self.out, self.steps, self.mode = Path(out), {int(s) for s in steps}, mode
        self.rank = int(os.environ.get("RANK", "0"))
        self.found: dict[int, dict[str, Any]] = {}
        self._active: Any = None
        self._cpu0 = 0.0

    def start(self, step: int) -> None:
        if step not in self.steps:
            return
        if self.mode == "ops":
            import torch

            self._active = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self._active.__enter__()
        elif self.mode == "clock":
            self._active = time.thread_time()
        else:
            import cProfile

            self._active = cProfile.Profile(time.thread_time)  # this thread's CPU: waits and preemption left out
            self._active.enable()
        self._cpu0 = time.process_time()

    def stop(self, step: int) -> None:
        if self._active is None:
            return
        active, self._active = self._active, None
        cpu_ms = (time.process_time() - self._cpu0) * 1e3
        if self.mode == "clock":
            self.found[step] = {"cpu_ms": cpu_ms, "thread_ms": (time.thread_time() - active) * 1e3}
        elif self.mode == "ops":
            active.__exit__(None, None, None)
            ops = {e.key: [e.count, e.self_cpu_time_total / 1e3] for e in active.key_averages()}
            self.found[step] = {"cpu_ms": cpu_ms, "ops": ops}
        else:
            import pstats

            active.disable()
            stats = pstats.Stats(active).stats  # type: ignore[attr-defined]
            funcs = {
                f"{Path(f).name}:{line}({name})": [nc, tt * 1e3, ct * 1e3]
                for (f, line, name), (_, nc, tt, ct, _) in stats.items()
            }
            self.found[step] = {"cpu_ms": cpu_ms, "funcs": funcs}

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.rank}.json").write_text(json.dumps(self.found))

    # meshtrain's callback hooks (trainer/loop/callbacks.py calls them by name)
    def on_step_start(self, trainer: Any, *, step: int) -> None:
        self.start(step)

    def on_step_end(self, trainer: Any, *, step: int, metrics: dict[str, Any]) -> None:
        self.stop(step)

    def on_train_end(self, trainer: Any, *, summary: dict[str, Any]) -> None:
        self.write()


def bare_side() -> None:
    """Under torchrun: the pair's hand-written loop (``benchmarks/bare_<strategy>.py``'s ``main``), its steps probed."""
    import importlib

    from benchmarks import bare_common as bare

    own = {"--out": None, "--probe": None, "--mode": None, "--script": None}
    argv = []
    for arg in sys.argv[1:]:
        key = arg.split("=", 1)[0]
        if key in own:
            own[key] = arg.split("=", 1)[1]
        else:
            argv.append(arg)
    sys.argv[1:] = argv
    probe = StepProbe(own["--out"], [int(s) for s in own["--probe"].split(",")], own["--mode"])
    timed_loop = bare.timed_loop

    def probed_loop(args, train_step, *, report: bool) -> None:
        def step(s: int):
            probe.start(s)
            loss = train_step(s)
            probe.stop(s)
            return loss

        timed_loop(args, step, report=report)
        probe.write()

    bare.timed_loop = probed_loop
    importlib.import_module(f"benchmarks.{own['--script'].removesuffix('.py')}").main()


def run_side(side: str, *, strategy: str, steps: int, probe: list[int], mode: str, out: Path, extra: list[str]) -> None:
    from benchmarks.overhead import PAIRS

    pair = PAIRS[strategy]
    shape = {"steps": steps, "batch": 32, "seq": 128}
    if side == "bare":
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
        cmd = [torchrun, f"--nproc_per_node={pair.nproc}", "--log-dir", str(out / "logs"), __file__, "--bare-side"]
        cmd += [f"--{k}={v}" for k, v in shape.items()] + ["--model=gpt_small", f"--script={pair.script}"]
        cmd += [f"--out={out / side}", f"--probe={','.join(map(str, probe))}", f"--mode={mode}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
    else:
        callback = f"{{_target_:benchmarks.step_ops.StepProbe,out:'{out / side}',steps:{probe},mode:{mode}}}"
        cmd = [sys.executable, str(ROOT / "train.py"), *pair.overrides, "model=gpt_small", f"trainer.max_steps={steps}"]
        cmd += ["trainer.checkpoint_every=0", f"trainer.log_every={LOG_EVERY}", "data.global_batch_size=32"]
        cmd += ["data.seq_len=128", f"hydra.run.dir={out / 'run'}", f"trainer.callbacks=[{callback}]", *extra]
        env = {**os.environ, "WANDB_SILENT": "true"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"{side} side failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def read_side(folder: Path) -> dict[int, dict[int, dict[str, Any]]]:
    """rank -> step -> what the probe found."""
    return {
        int(p.stem): {int(s): v for s, v in json.loads(p.read_text()).items()} for p in sorted(folder.glob("*.json"))
    }


def per_step(found: dict[int, dict[int, dict[str, Any]]], steps: list[int], key: str) -> Counter:
    """Mean count per step and rank of each op (or Python function) over ``steps``."""
    total: Counter = Counter()
    n = 0
    for by_step in found.values():
        for s in steps:
            if s in by_step:
                n += 1
                for name, values in by_step[s][key].items():
                    total[name] += values[0]
    return Counter({k: v / max(n, 1) for k, v in total.items()})


def clock_report(sides: dict[str, dict], *, probe: list[int]) -> None:
    """Each rank's CPU ms per window (its main thread's, and its whole process's), unlogged steps: min, lower
    quartile, median (the minimum is the window's work with the least interference from the machine's load)."""
    plain = [s for s in probe if s % LOG_EVERY and s != 1]
    print(f"\nCPU ms per unlogged step {plain[0]}-{plain[-1]} ({len(plain)} steps): min / lower quartile / median")
    for side, found in sides.items():
        for rank, by_step in found.items():
            cells = []
            for key in ("thread_ms", "cpu_ms"):
                v = sorted(by_step[s][key] for s in plain if s in by_step)
                cells.append(f"{key.removesuffix('_ms')} {v[0]:.1f} / {v[len(v) // 4]:.1f} / {v[len(v) // 2]:.1f}")
            print(f"  {side:9s} rank {rank}: main " + "; process ".join(cells))


def report(sides: dict[str, dict], *, probe: list[int], mode: str, rows: int) -> None:
    if mode == "clock":
        clock_report(sides, probe=probe)
        return
    key = "ops" if mode == "ops" else "funcs"
    for side, found in sides.items():
        print(f"\n{side}: CPU ms in each profiled window (profiler included), per rank")
        for rank, by_step in found.items():
            cells = []
            for s in probe:
                v = by_step.get(s)
                if v is not None:
                    aten = sum(c[0] for name, c in v[key].items() if name.startswith("aten::")) if mode == "ops" else 0
                    calls = sum(c[0] for c in v[key].values())
                    cells.append(
                        f"step {s}: {v['cpu_ms']:.1f} ms, {calls:.0f} {'events' if mode == 'ops' else 'calls'}"
                        + (f" ({aten:.0f} aten)" if mode == "ops" else "")
                    )
            print(f"  rank {rank}: " + "; ".join(cells))
    logged = [s for s in probe if s % LOG_EVERY == 0 or s == 1]
    plain = [s for s in probe if s not in logged]
    for label, steps in (("unlogged steps", plain), ("logged steps", logged)):
        if not steps:
            continue
        bare, mesh = (per_step(sides[s], steps, key) for s in ("bare", "meshtrain"))
        if mode == "ops":
            diff = {n: mesh[n] - bare[n] for n in set(bare) | set(mesh) if abs(mesh[n] - bare[n]) >= 0.5}
            tot = {
                s: sum(v for n, v in c.items() if n.startswith("aten::"))
                for s, c in (("bare", bare), ("meshtrain", mesh))
            }
            print(
                f"\n{label} {steps}: aten ops per step and rank, bare {tot['bare']:.0f}, meshtrain {tot['meshtrain']:.0f}; "
                "names whose count differs (meshtrain - bare):"
            )
            for name, d in sorted(diff.items(), key=lambda kv: (-abs(kv[1]), kv[0]))[:rows]:
                print(f"  {d:+8.1f}  {name}  (bare {bare[name]:.1f}, meshtrain {mesh[name]:.1f})")
        else:
            for side in ("bare", "meshtrain"):
                own = Counter()
                for by_step in sides[side].values():
                    for s in steps:
                        for name, (_, tt, _ct) in by_step.get(s, {}).get("funcs", {}).items():
                            own[name] += tt / (len(steps) * len(sides[side]))
                print(f"\n{label} {steps}, {side}: Python functions by own ms per step and rank")
                for name, ms in own.most_common(rows):
                    print(f"  {ms:7.3f} ms  {name}")


def steps_of(part: str) -> list[int]:
    """``7`` or a range ``3-40``."""
    first, _, last = part.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    if "--bare-side" in sys.argv:
        sys.argv.remove("--bare-side")
        bare_side()
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", default="ddp", help="a pair of benchmarks/overhead.py (ddp, fsdp, tp, pp)")
    ap.add_argument("--mode", choices=("ops", "python", "clock"), default="ops")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--profile", default="20,21,22,23", help="the steps to profile: numbers and ranges, comma-separated (3-40)"
    )
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--overrides", nargs="*", default=[], help="extra train.py overrides (meshtrain side)")
    ap.add_argument("--keep", default=None, help="a folder to keep each rank's findings in (JSON), for a closer look")
    args = ap.parse_args(argv)
    probe = [n for part in args.profile.split(",") for n in steps_of(part)]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="step_ops_") as tmp:
        tmp = args.keep or tmp
        for side in ("bare", "meshtrain"):
            run_side(
                side,
                strategy=args.strategy,
                steps=args.steps,
                probe=probe,
                mode=args.mode,
                out=Path(tmp),
                extra=args.overrides,
            )
        sides = {side: read_side(Path(tmp) / side) for side in ("bare", "meshtrain")}
    print(
        f"{args.strategy}, gpt_small, {args.steps} steps, profiled {probe} ({args.mode}); load average before {load}, "
        f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    report(sides, probe=probe, mode=args.mode, rows=args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
