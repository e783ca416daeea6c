"""parallel=auto end to end: the planner's ranking is printed and its first choice is what trains."""

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow


def test_auto_plans_prints_and_trains_first_choice(tmp_path):
    run = run_train("parallel=auto", *FAST, "trainer.max_steps=3", run_dir=tmp_path / "run")
    assert "parallel=auto chose" in run.output
    layout = run.summary()["layout"]
    assert layout["strategy"] != "auto" and layout["strategy"] in run.output
    assert layout["world_size"] == layout["dp"] * layout["tp"] * layout["pp"]
    assert [m["step"] for m in run.metrics()] == [1, 2, 3]
