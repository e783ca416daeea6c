"""A run says what it does before its first step, each stage with the seconds since the command started, and
``time_to_first_step_s`` counts from that start (issue 42); its closing line lists what the run folder holds."""

from __future__ import annotations

import re
import time

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow

STAGE = re.compile(r"^\[\+(\d+\.\d) s\] (.*)$", re.M)

#: the console's start-up lines of a two-worker run, in order (launcher, then rank 0)
STAGES = (
    "checking the run: parallel=pp",
    "preparing the data (data=text)",
    "importing torch and the launcher",
    "starting 2 worker(s) on this node",
    "rank 0/2 on cpu (gloo), mesh pp 0/2, dp 0/1, cp 0/1, tp 0/1; ep 0/1 (borrowed)",
    "building the model (gpt_small) and composing the layout (pp: pp2 on 2 ranks)",
    "model built (gpt_small)",
    "first step (1 of 2) running",
    "first step done",
)


def test_start_up_stages_and_time_to_first_step(tmp_path):
    before = time.time()
    run = run_train("parallel=pp", *FAST, "trainer.max_steps=2", "trainer.checkpoint_every=0", run_dir=tmp_path / "r")
    stages = STAGE.findall(run.proc.stdout)
    texts = [text for _, text in stages]
    positions = [next((i for i, t in enumerate(texts) if t.startswith(s)), None) for s in STAGES]
    assert None not in positions and positions == sorted(positions), run.proc.stdout[-4000:]
    seconds = [float(s) for s, _ in stages]
    assert seconds == sorted(seconds)
    # the stages come before the first step's line
    assert run.proc.stdout.index("first step done") < run.proc.stdout.index("step     1 |")

    summary = run.summary()
    first = summary["time_to_first_step_s"]
    said = dict((t.split(" (")[0], float(s)) for s, t in stages)
    assert first == pytest.approx(said["first step done"], abs=0.2)  # the console's number is the summary's
    assert first >= said["starting 2 worker(s) on this node"]  # counted from the command's start, not the worker's
    assert first <= summary["first_step_end_unix"] - before + 0.05  # ... which came after this test started it
    assert 0 < summary["fit_to_first_step_s"] < first  # the old meaning, named for what it counts

    rank1 = (run.run_dir / "logs" / "rank1.log").read_text()  # every rank logs its own stages
    for text in ("rank 1/2 on cpu", "building the model", "first step done"):
        assert re.search(rf"\] INFO \[\+\d+\.\d s\] {text}", rank1), rank1[-2000:]

    # the closing line: everything the folder holds (hidden files aside), the pipeline's timeline among them
    listed = next(line for line in run.proc.stdout.splitlines() if line.startswith("outputs in "))
    held = sorted(p.name + "/" if p.is_dir() else p.name for p in run.run_dir.iterdir())
    assert listed == f"outputs in {run.run_dir}: " + ", ".join(n for n in held if n.endswith("/") or n[0] != ".")
    assert "timeline/" in listed and "summary.json" in listed
