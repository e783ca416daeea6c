"""Helpers shared by tests/unit and tests/integration: run train.py as a user would (a real subprocess), read its
outputs back, compare losses. The ``compose_cfg`` fixture lives in tests/conftest.py."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

#: small and quick: every multi-process test starts from these. Every step logged and measured (collective timers,
#: saved activations), so a test reads each step's measurements; the default trainer.measure_every=10 samples them
#: (tests/integration/test_checkpoint_restart_preemption.py checks that)
FAST = (
    "trainer.log_every=1",
    "trainer.measure_every=1",
    "logger=none",
    "data.seq_len=32",
    "data.global_batch_size=8",
)

#: the length of the layout parity runs (tests/integration/test_hybrid_parity.py, test_pipeline_parity_and_bubble.py,
#: test_tp_fsdp_parity.py): one length, so their parallel=single reference (conftest's ``reference``, FAST + this) runs
#: once per pytest worker
PARITY_STEPS = ("trainer.max_steps=6",)


@dataclass
class TrainRun:
    proc: subprocess.CompletedProcess
    run_dir: Path

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def metrics(self) -> list[dict]:
        with open(self.run_dir / "metrics.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics()]


#: environment variables read while a run runs, not when torch or Hydra is imported: safe to set per warm run
RUN_TIME_ENV = ("WANDB_", "HYDRA_FULL_ERROR", "MESHTRAIN_")


def run_train(
    *overrides: str,
    run_dir: Path | None,
    expect_ok: bool = True,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    multirun: bool = False,
    cwd: Path = ROOT,
    cold: bool = False,
    interpreter_args: tuple[str, ...] = (),
    max_file_bytes: int | None = None,
) -> TrainRun:
    """``python train.py OVERRIDES`` with its output folder under ``run_dir`` (``None``: Hydra's own, under ``cwd``).

    By default the run forks from the warm runner (tests/warm_runner.py: the same train.py, argv, folder and
    environment, with torch and Hydra already imported); ``cold=True`` (or MESHTRAIN_TESTS_COLD=1) starts a new
    interpreter as a user's shell does. ``max_file_bytes``: the run's RLIMIT_FSIZE (a write past it fails with
    EFBIG, Python ignoring SIGXFSZ: the way writes fail on a full disk)."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    args = [*(["-m"] if multirun else []), *overrides, *([f"{key}={run_dir}"] if run_dir is not None else [])]
    full_env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", **(env or {})}
    warm = not cold and os.environ.get("MESHTRAIN_TESTS_COLD") != "1"
    if warm and not interpreter_args and all(k.startswith(RUN_TIME_ENV) for k in env or {}):
        from tests.warm_runner import runner

        outputs = Path(tempfile.mkdtemp(prefix="warm-run-"))
        try:
            proc = runner().run(
                args, cwd=cwd, env=full_env, timeout=timeout, tmp=outputs, max_file_bytes=max_file_bytes
            )
        finally:
            shutil.rmtree(outputs, ignore_errors=True)
    else:
        cmd = [sys.executable, *interpreter_args, str(ROOT / "train.py"), *args]
        limit = None
        if max_file_bytes:

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd, preexec_fn=limit
        )
    run = TrainRun(proc=proc, run_dir=run_dir)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{run.output[-6000:]}")
    return run


def make_train(*overrides: str, run_dir: Path) -> TrainRun:
    """``make train ARGS="..."`` from the repository root, as the README starts the default job: a cold interpreter
    through the Makefile (``-o``: the environment this test runs in counts as bootstrapped)."""
    venv = Path(sys.prefix)
    args = " ".join([*overrides, f"hydra.run.dir={run_dir}"])
    cmd = ["make", "--no-print-directory", "train", f"VENV={venv}", "-o", str(venv / ".installed"), f"ARGS={args}"]
    env = {**os.environ, "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return TrainRun(proc=proc, run_dir=run_dir)


def layout_case(model: str, parallel: str = "hybrid", **groups: dict) -> dict:
    """A ``case_multirun`` case: ``model`` under ``parallel`` with ``groups``' keys (hybrid's dp, tp and pp sizes 1
    unless given; ``trainer`` as given)."""
    sizes = {"dp": {"size": 1}, "tp": {"size": 1}, "pp": {"size": 1}} if parallel == "hybrid" else {}
    extra = {k: v for k, v in groups.items() if k != "trainer"}
    return {
        "defaults": [{"override /parallel": parallel}, {"override /model": model}],
        **{k: {**sizes.get(k, {}), **v} for k, v in {**sizes, **extra}.items()},
        **({"trainer": groups["trainer"]} if "trainer" in groups else {}),
    }


def no_checkpoint(case: dict) -> dict:
    """A ``case_multirun`` case that ends without the checkpoint the last step writes by default
    (``trainer.checkpoint_every=0``): for runs whose metrics are compared and whose parameters are never read back (a
    checkpoint changes no number; its save cost ~0.25 s CPU a rank on the debug models)."""
    return {**case, "trainer": {**case.get("trainer", {}), "checkpoint_every": 0}}


def case_multirun(
    cases: dict[str, dict], *overrides: str, base: Path, group: str, timeout: float = 1500
) -> dict[str, Path]:
    """Each case (a ``# @package _global_`` config) written as an option of config group ``group`` in a search
    path under ``base`` (nothing added under conf/), all of them run as one multirun; returns case -> job folder."""
    import yaml

    folder = base / "conf" / group
    folder.mkdir(parents=True)
    for name, case in cases.items():
        (folder / f"{name}.yaml").write_text("# @package _global_\n" + yaml.safe_dump(case))
    run = run_train(
        f"+{group}={','.join(cases)}",
        f"hydra.searchpath=[file://{base / 'conf'}]",
        *overrides,
        run_dir=base / "sweep",
        multirun=True,
        timeout=timeout,
    )
    assert f"{len(cases)} jobs: {len(cases)} completed" in run.output, run.output[-4000:]
    jobs = {}
    for job in (base / "sweep").iterdir():
        chosen = job / ".hydra" / "overrides.yaml"
        if chosen.is_file():
            picked = yaml.safe_load(chosen.read_text())
            jobs[next(o.split("=", 1)[1] for o in picked if o.startswith(f"+{group}="))] = job
    return jobs


def imported_modules(importtime_stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported, read from its stderr."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def refused_before_torch(*overrides: str, run_dir: Path) -> TrainRun:
    """``python train.py OVERRIDES`` in a cold interpreter that must refuse with exit code 2 before importing torch
    (what keeps a refusal fast; read from ``-X importtime``, not from a clock)."""
    run = run_train(
        *overrides, run_dir=run_dir, expect_ok=False, timeout=60, cold=True, interpreter_args=("-X", "importtime")
    )
    assert run.proc.returncode == 2, run.output[-3000:]
    assert "torch" not in imported_modules(run.proc.stderr), "the refusal imported torch"
    return run


def log_time(log: Path, needle: str) -> float:
    """Unix time of the first line of a rank log (``2026-12-03 16:08:13,139 [rank0] ...``) that holds ``needle``."""
    from datetime import datetime

    for line in log.read_text().splitlines():
        if needle in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no line with {needle!r} in {log}")


def exit_times(run_dir: Path, attempt: int = 0) -> dict[int, float]:
    """When each rank left its worker (``logs/attempts/<attempt>/rank<R>.json``; a killed rank has none)."""
    folder = run_dir / "logs" / "attempts" / str(attempt)
    return {int(p.stem[4:]): json.loads(p.read_text())["time"] for p in folder.glob("rank*.json")}


def assert_losses_close(a: list[float], b: list[float], rel: float = 1e-4) -> None:
    assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
    for step, (x, y) in enumerate(zip(a, b), start=1):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y} (rel {abs(x - y) / abs(y):.2e} > {rel})"


def final_state(run: TrainRun) -> dict:
    """The model state of the run's newest checkpoint (the last step writes one unless
    trainer.checkpoint_every=0), as full tensors by parameter name, whatever layout wrote it."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from trainer.checkpoint.files import checkpoints_root, complete_checkpoints

    found = complete_checkpoints(checkpoints_root(run.run_dir))
    assert found, f"no complete checkpoint in {run.run_dir}"
    out = run.run_dir / "final_state.pt"
    if not out.exists():
        dcp_to_torch_save(str(found[-1][1]), str(out))
    state = torch.load(out, weights_only=False)["model"]
    return {k: v for k, v in state.items() if hasattr(v, "shape")}


def assert_parity(
    run: TrainRun, ref: TrainRun, *, rel: float = 1e-4, params_atol: float = 1e-4, skip: tuple[str, ...] = ()
) -> float:
    """``run`` trained like ``ref`` (parallel=single): per-step losses and gradient norms within ``rel``,
    and the final parameters within ``params_atol`` (max abs difference, returned). The gradient norm
    catches gradients off by a constant factor, which clipping and AdamW's scale invariance hide from
    the loss; the parameters catch a parameter that is updated wrongly or not at all (one missed AdamW
    update moves a parameter by ~lr = 3e-3; fp32 reduction order gives up to ~2e-5 after 12 steps here)."""
    assert_losses_close(run.losses(), ref.losses(), rel=rel)
    got, want = [m["grad_norm"] for m in run.metrics()], [m["grad_norm"] for m in ref.metrics()]
    for step, (g, w) in enumerate(zip(got, want), start=1):
        assert abs(g - w) <= rel * abs(w), f"grad_norm at step {step}: {g} vs {w} (rel {abs(g - w) / abs(w):.2e})"
    a, b = final_state(run), final_state(ref)
    keys = {k for k in b if not any(s in k for s in skip)}
    assert keys <= set(a), f"parameters missing from the run's checkpoint: {sorted(keys - set(a))[:5]}"
    worst, where = 0.0, None
    for k in sorted(keys):
        assert a[k].shape == b[k].shape, (k, a[k].shape, b[k].shape)
        d = (a[k].double() - b[k].double()).abs().max().item()
        if d > worst:
            worst, where = d, k
    assert worst <= params_atol, f"final parameters differ by {worst:.3e} at {where} (> {params_atol:.0e})"
    return worst


WORDS = "alpha beta gamma delta tensor pipeline stage loss gradient shard the a of and to".split()


def write_corpus(folder: Path, *, n_text: int = 6, words: int = 300) -> list[str]:
    """Text files, a jsonl and a parquet file of pseudo-prose; returns every document in input order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)

    def doc(n: int) -> str:
        return " ".join(rng.choice(WORDS, size=n)) + ".\n"

    folder.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list[str]] = {}
    for i in range(n_text):
        by_file[f"notes_{i}.txt"] = [doc(words)]
        (folder / f"notes_{i}.txt").write_text(by_file[f"notes_{i}.txt"][0])
    rows = [doc(words // 3) for _ in range(3)]
    (folder / "more.jsonl").write_text("".join(json.dumps({"text": t, "id": k}) + "\n" for k, t in enumerate(rows)))
    by_file["more.jsonl"] = rows
    table = [doc(words // 3) for _ in range(2)]
    pq.write_table(pa.table({"text": table}), folder / "table.parquet")
    by_file["table.parquet"] = table
    return [d for name in sorted(by_file) for d in by_file[name]]


def assert_dry_run_matches_plan(model_config, candidate, *, model, hardware, workload) -> None:
    """Build ``candidate`` (a plan's first choice) under torch's fake process group for the first rank of its first and
    of its last pipeline stage (whole FSDP2 shards) and hold their measured model state and saved activations per
    micro-batch to the plan's, 1% (``python -m parallel.plan ... --dry-run`` samples more ranks: docs/planner.md)."""
    import pytest

    from parallel.plan.dry_run import dry_run

    first = {n: 0 for n in candidate.mesh_dim_names}
    ranks = sorted({candidate.rank_of(**first), candidate.rank_of(**{**first, "pp": candidate.pp - 1})})
    report = dry_run(
        model_config=model_config, candidate=candidate, model=model, hardware=hardware, workload=workload, ranks=ranks
    )
    for r in report.ranks:
        assert r.error is None, r.error
        state, acts = r.ratio("model_state"), r.ratio("activations_per_micro_batch")
        print(f"{model.name} rank {r.rank}: model state x{state:.4f}, activations x{acts:.4f} of the plan")
        assert state == pytest.approx(1.0, abs=0.01) and acts == pytest.approx(1.0, abs=0.01), r
