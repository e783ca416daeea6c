"""Which steps pay for the costlier measurements (``trainer.measure_every``): the first logged step of each window."""

from __future__ import annotations

import pytest

from trainer.loop.fit import Trainer


class _Loop:
    """The loop's step bookkeeping alone: what ``Trainer._should_measure`` reads."""

    _should_log = Trainer._should_log
    _should_measure = Trainer._should_measure
    _eval_due = Trainer._eval_due

    def __init__(self, *, log_every: int, measure_every: int, max_steps: int, eval_every: int = 0):
        self.log_every, self.measure_every, self.max_steps, self.eval_every = (
            log_every,
            measure_every,
            max_steps,
            eval_every,
        )

    def measured(self, first: int = 1) -> list[int]:
        return [s for s in range(first, self.max_steps + 1) if self._should_measure(s)]


@pytest.mark.parametrize(
    ("log_every", "measure_every", "max_steps", "eval_every", "expected"),
    [
        # every step logged: one in ten measured (the tp pair of benchmarks/vs_torchtitan.py logs every step)
        (1, 10, 35, 0, [1, 10, 20, 30]),
        # the defaults: every logged step that is a multiple of 10 and the first; a last step inside a window that
        # was measured already (45) is logged without them
        (10, 10, 45, 0, [1, 10, 20, 30, 40]),
        # 1: every logged step
        (1, 1, 5, 0, [1, 2, 3, 4, 5]),
        (4, 1, 12, 0, [1, 4, 8, 12]),
        # logged steps 1, 4, 8, 12, 16, 20, 22: the first of each window of 10
        (4, 10, 22, 0, [1, 12, 20]),
        # evaluation steps are logged steps too
        (10, 10, 30, 5, [1, 10, 20, 30]),
        (1, 7, 15, 0, [1, 7, 14]),
    ],
)
def test_the_first_logged_step_of_each_window_is_measured(log_every, measure_every, max_steps, eval_every, expected):
    loop = _Loop(log_every=log_every, measure_every=measure_every, max_steps=max_steps, eval_every=eval_every)
    assert loop.measured() == expected
    assert set(expected) <= {s for s in range(1, max_steps + 1) if loop._should_log(s)}


def test_a_resumed_run_measures_the_steps_an_uninterrupted_one_does():
    """Decided from the step number alone: resuming at step 6 changes nothing after it."""
    loop = _Loop(log_every=3, measure_every=10, max_steps=40)
    assert loop.measured(first=6) == [s for s in loop.measured() if s >= 6] == [12, 21, 30, 40]
