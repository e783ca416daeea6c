"""trainer/launch/attempts.py ``first_failure``: the launcher names the rank whose exit record holds the earliest
error (the cause), not its peer whose connection to it closed a moment later (the effect)."""

from __future__ import annotations

from trainer.launch.attempts import first_failure
from trainer.observe.durable import write_json


def _record(run_dir, attempt: int, rank: int, time: float, error: str | None) -> None:
    folder = run_dir / "logs" / "attempts" / str(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / f"rank{rank}.json", {"rank": rank, "time": time, "error": error})


def test_the_earliest_error_of_the_last_attempt_names_the_rank(tmp_path):
    assert first_failure(tmp_path, [0, 1]) is None  # no records: torch's order stands
    _record(tmp_path, 0, 0, 5.0, "RuntimeError: an earlier attempt")
    _record(tmp_path, 1, 1, 10.0, "RuntimeError: injected failure at step 3 on rank 1")
    _record(tmp_path, 1, 0, 10.2, "RuntimeError: Connection closed by peer")
    first = first_failure(tmp_path, [0, 1])
    assert (first["rank"], first["error"]) == (1, "RuntimeError: injected failure at step 3 on rank 1")
    assert first_failure(tmp_path, [0])["rank"] == 0  # only the ranks asked about
    _record(tmp_path, 2, 0, 20.0, None)
    assert first_failure(tmp_path, [0, 1]) is None  # the last attempt: no error recorded
