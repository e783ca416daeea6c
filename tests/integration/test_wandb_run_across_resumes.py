"""One W&B run per training run: 10 steps, then a resume to 20 with an elastic restart after a rank dies at 13,
continue one W&B run id whose history has steps 1..20 once each; the run records its provenance, define_metric, checkpoints as reference artifacts
and its config; read back with W&B's own reader (``wandb leet inspect``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.faults import KillAt, inject
from tests.helpers import FAST, ROOT, run_train
from trainer.observe.wandb_read import inspect_summary, read_run

WANDB = tuple(o for o in FAST if not o.startswith("logger=")) + ("logger=wandb",)
RUN = ("parallel=ddp", *WANDB, "trainer.checkpoint_every=10")


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """10 steps; then the same folder to 20 (a resume), where rank 1 is killed at step 13 and the elastic
    agent restarts the workers (steps 11, 12 reached W&B; the restart recomputes them from step 10)."""
    run_dir = tmp_path_factory.mktemp("tracking") / "run"
    run_train(*RUN, "trainer.max_steps=10", run_dir=run_dir)
    final = run_train(
        *RUN,
        "trainer.max_steps=20",
        "topology.max_restarts=1",
        inject(KillAt, step=13, rank=1),
        run_dir=run_dir,
        timeout=400,
    )
    assert "continuing at step 11 of 20" in final.output and "elastic restart 1" in final.output
    assert final.summary()["restarts"] == 1
    # the end line compares the run's first loss (step 1, written by the first command) with its last
    first, last = final.metrics()[0], final.metrics()[-1]
    assert (first["step"], last["step"]) == (1, 20)
    assert f"done: loss {first['loss']:.4f} at step 1 -> {last['loss']:.4f} at step 20," in final.output
    assert (final.summary()["first_loss"], final.summary()["first_loss_step"]) == (first["loss"], 1)
    return final, read_run(run_dir)


@pytest.mark.slow
def test_resumes_continue_one_wandb_run(resumed_run):
    final, wb = resumed_run
    ident = json.loads((final.run_dir / "wandb_run.json").read_text())
    # one offline segment per rank-0 process that reached W&B (the first run, the resume, and its elastic
    # restart when the killed attempt got W&B started before it died), all with one run id (wandb sync
    # appends them to one run)
    assert len(wb.segments) == ident["segments"] in (2, 3) and wb.run_ids == [ident["id"]] * ident["segments"]
    assert wb.exit_codes[0] == 0 and wb.exit_codes[-1] == 0
    # the continued run follows its own trainer.max_steps=20: lr decays once, no restart of the cosine
    lrs = [m["lr"] for m in final.metrics()]
    assert lrs[10] == pytest.approx(3e-3) and all(a > b for a, b in zip(lrs[10:], lrs[11:]))
    # history: steps 1..20 once each, each step's loss as metrics.jsonl has it (exact resume)
    assert wb.steps() == list(range(1, 21))
    assert [r["_step"] for r in wb.history if "train/step" in r] == list(range(1, 21))
    losses = {m["step"]: m["loss"] for m in final.metrics()}
    assert {r["train/step"]: r["train/loss"] for r in wb.history} == pytest.approx(losses, rel=1e-6)


@pytest.mark.slow
def test_run_records_provenance_metrics_and_artifacts(resumed_run):
    final, wb = resumed_run
    run = wb.config["run"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert run["git"]["commit"] == head
    assert "trainer.max_steps=20" in run["overrides"] and run["command"].startswith("train.py ")
    assert wb.config["trainer"]["max_steps"] == 20 and wb.config["logger"]["wandb"]["system_stats"] is False
    # define_metric: the training step is the x axis; summaries min loss, max tokens/s
    defined = {m.get("name") or m.get("glob_name"): m for m in wb.metrics}
    assert defined["train/*"]["step_metric"] == "train/step"
    assert defined["train/loss"]["summary"] == {"min": True, "last": True}
    assert defined["perf/tokens_per_s"]["summary"]["max"] is True
    # checkpoints by reference (file://, nothing uploaded), aliases latest/best; the resolved config
    ckpts = [a for a in wb.artifacts if a["type"] == "model"]
    assert [json.loads(a["metadata"])["step"] for a in ckpts] == [10, 20]
    assert all({"latest", "best"} <= set(a["aliases"]) for a in ckpts)
    refs = [e["ref"] for a in ckpts for e in a["manifest"]["contents"]]
    assert refs and all(r.startswith(f"file://{final.run_dir.resolve()}/checkpoints/step_") for r in refs)
    assert all("local_path" not in e for a in ckpts for e in a["manifest"]["contents"])
    config_art = [a for a in wb.artifacts if a["type"] == "config"][-1]
    names = {e["path"] for e in config_art["manifest"]["contents"]}
    assert {"resolved_config.yaml", "config.yaml", "overrides.yaml"} <= names


@pytest.mark.slow
def test_wandb_leet_reads_the_finished_run(resumed_run):
    """W&B's own reader: ``wandb leet inspect --summary --json`` on the last segment's folder."""
    final, wb = resumed_run
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(wb.segments[-1])]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert out == inspect_summary(wb.segments[-1])
    assert out["state"] == "finished" and out["exit_code"] == 0 and out["run_id"] == wb.run_id
    summary = json.loads((final.run_dir / "summary.json").read_text())
    assert out["summary"]["final_loss"] == pytest.approx(summary["final_loss"])
    own = [m["loss"] for m in final.metrics() if m["step"] >= 13]  # this segment logged 13..20
    assert out["summary"]["train/loss"]["min"] == pytest.approx(min(own))
    assert out["summary"]["train/loss"]["last"] == pytest.approx(own[-1])
    assert out["config"]["run"]["git"]["commit"] == wb.config["run"]["git"]["commit"]
