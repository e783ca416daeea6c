"""Figures a run draws when it ends rather than when their data is ready (the rank map, the pipeline timeline).

Importing matplotlib and drawing one figure took 0.9-1.4 s on rank 0 (measured on 2 busy cores): before the
first step every other rank waits for it at the first collective, and inside the loop it stalls the step it
lands in. So the data is kept and the drawing is announced (``draw_later``); rank 0's sinks call
``draw_announced`` as the run finishes, completed or failed, before the summary and W&B list the files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

#: figures announced in this process and not drawn yet, by the path they go to
_UNDRAWN: dict[Path, Callable[[], Path]] = {}


def draw_later(path: Path, draw: Callable[[], Path]) -> Path:
    """Announce that ``draw()`` writes ``path`` at the end of the run; returns ``path`` (for the summary)."""
    _UNDRAWN[Path(path)] = draw
    return Path(path)


def draw_announced() -> list[Path]:
    """Draw every announced figure, each once; returns their paths."""
    drawn = []
    while _UNDRAWN:
        _, draw = _UNDRAWN.popitem()
        drawn.append(draw())
    return drawn
