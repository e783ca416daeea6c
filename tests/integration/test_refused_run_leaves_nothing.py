"""A refused command leaves nothing that export or resume would pick up: after a good run and a refused one, the
newest folder under outputs/ is still the good run, which exports and resumes (the README's
``python -m trainer.export outputs/<date>/<time>`` right after a typo)."""

from __future__ import annotations

import pytest

from tests.helpers import FAST, run_train

pytestmark = pytest.mark.slow


def test_after_a_refused_run_the_newest_run_folder_is_the_last_good_run(tmp_path):
    from trainer.checkpoint.files import resolve_resume
    from trainer.export import main as export

    good = tmp_path / "outputs" / "2026-01-01" / "00-00-00"  # sorts before any folder made today
    run_train("parallel=single", *FAST, "trainer.max_steps=2", run_dir=good, cwd=tmp_path)
    for typo in (["+paralel=fsdp"], ["dp.size=3"], ["paralel=fsdp"]):  # a key nothing reads, a layout, Hydra's own
        # as typed: no hydra.run.dir, so Hydra would make its own outputs/<date>/<time> under the folder
        refused = run_train(*typo, run_dir=None, cwd=tmp_path, env={"WANDB_MODE": "disabled"}, expect_ok=False)
        assert refused.proc.returncode == 2, refused.proc.stderr[-2000:]
    newest = sorted((tmp_path / "outputs").glob("*/*"))[-1]
    assert newest == good, sorted((tmp_path / "outputs").glob("*/*"))
    assert export([str(newest), "--hf", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "model.safetensors").is_file()
    assert resolve_resume(str(newest), tmp_path / "next").name == "step_0000002"  # trainer.resume=<newest>
