"""Bring your own model: the user's module and ModelSpec (``tests/byo_model/``) and a YAML in the user's
own config folder, trained under single, ddp, fsdp and pp (docs/models.md), with the same losses."""

from __future__ import annotations

import json

import pytest

from tests.byo_model import write_user_conf
from tests.helpers import FAST, assert_losses_close, run_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def search_path(tmp_path_factory):
    return write_user_conf(tmp_path_factory.mktemp("user"))


def test_own_model_trains_under_ddp_fsdp_and_pp_like_single(search_path, tmp_path):
    sweep = tmp_path / "sweep"
    run = run_train(
        "parallel=single,ddp,fsdp,pp",
        "model=mlp_lm",
        search_path,
        *FAST,
        "trainer.max_steps=4",
        "trainer.checkpoint_every=0",
        "pp.trace_step=0",
        run_dir=sweep,
        multirun=True,
    )
    assert "4 jobs: 4 completed" in run.output, run.output[-3000:]
    losses, summaries = {}, {}
    for job in sweep.iterdir():
        if not (job / "summary.json").is_file():
            continue
        summary = json.loads((job / "summary.json").read_text())
        summaries[summary["strategy"]] = summary
        losses[summary["strategy"]] = [json.loads(x)["loss"] for x in (job / "metrics.jsonl").read_text().splitlines()]
    assert sorted(losses) == ["ddp", "fsdp", "pp", "single"]
    assert losses["single"][-1] < losses["single"][0]
    for name in ("ddp", "fsdp", "pp"):
        assert_losses_close(losses[name], losses["single"], rel=1e-4)
    stages = summaries["pp"]["pipeline"]["stages"]
    assert [r["layers"] for r in stages] == ["embed + layers.0-1", "layers.2-3 + norm + head"]
