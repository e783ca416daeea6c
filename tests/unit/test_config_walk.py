"""benchmarks/config_walk.py, the walk of the composed config from ``run_task`` (docs/architecture.md): on a planted
tree it follows only calls that carry the config, counts a call into a room entered before as a return, and on
this checkout it returns at most 20 times (issue 48)."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import ROOT
from tests.source_files import parsed


def walker():
    spec = importlib.util.spec_from_file_location("config_walk", ROOT / "benchmarks" / "config_walk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_walk"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    module.parse = parsed  # the product's files parsed once per process, with test_architecture's and test_facts_once's
    return module


PLANTED = {
    "trainer/task.py": (
        "from trainer.checks import check\n"
        "from parallel.api import plan, unrelated\n\n"
        "def run_task(cfg):\n"
        "    run = check(cfg)\n"
        "    unrelated(3)\n"
        "    return plan(run)\n"
    ),
    "trainer/checks.py": "from parallel.api import typed\n\ndef check(cfg):\n    return typed(cfg.model)\n",
    "parallel/api.py": "def typed(node):\n    return node\n\ndef plan(run):\n    return run\n\ndef unrelated(n):\n    return n\n",
}


def test_the_walk_follows_the_config_and_counts_returns(tmp_path):
    cw = walker()
    for rel, source in PLANTED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    for package in ("conf", "models"):
        (tmp_path / package).mkdir()
    w = cw.walked(tmp_path)
    # task -> checks -> api (typed), back in task -> api (plan): api entered again; unrelated(3) carries no config
    assert w.path == ["trainer.task", "trainer.checks", "parallel.api", "parallel.api"] == cw.walk(tmp_path)
    assert cw.returns(w.path) == 1
    # --calls: each entering call, the return marked, then the rooms entered more than once
    assert cw.call_lines(w) == [
        "  trainer.task.run_task -> trainer.checks.check",
        "  trainer.checks.check -> parallel.api.typed",
        "R trainer.task.run_task -> parallel.api.plan",
        "2 x parallel.api",
    ]


def test_the_walk_returns_at_most_20_times_on_this_checkout():
    """Issue 48's bound: followed from ``run_task``, the config returns to a room it had left at most 20 times
    (docs/architecture.md, "The walk"; ``--calls`` lists them)."""
    cw = walker()
    path = cw.walk(ROOT)
    assert path[0] == "trainer.task" and len(set(path)) > 10
    assert cw.returns(path) <= 20, "\n".join(cw.call_lines(cw.walked(ROOT)))
