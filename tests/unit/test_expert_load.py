"""The expert load: each step's tokens per expert per MoE layer (a metrics.jsonl field) and the run's (summary.json)
from the engines' step tables, and the heatmap drawn from metrics.jsonl at the run's end (one panel per layer, read
back: its size follows the panels; a crowded expert shows red, a balanced run none)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from parallel.foundation.expert_load import KEY, ExpertLoad
from parallel.foundation.figures import draw_announced
from trainer.observe.expert_load_figure import (
    FILE,
    IMAGE,
    announce_expert_load,
    draw_expert_load,
    figure_size_px,
    load_grid,
)
from trainer.observe.metrics import MetricsFile, read_metrics


def table(*counts: list[int]) -> torch.Tensor:
    """``models.moe.moe_step_table``'s rows: aux loss sum, forwards, dropped, tokens per expert."""
    return torch.tensor([[0.5, 1.0, 0.0, *c] for c in counts], dtype=torch.float64)


def test_each_step_reports_its_tokens_per_expert_and_the_run_adds_them_up():
    load = ExpertLoad()
    assert load.summary() == {}
    first = load.add(["layer0", "layer2"], table([6, 2, 0, 0], [2, 2, 2, 2]))
    assert first[KEY] == {"layer0": [6, 2, 0, 0], "layer2": [2, 2, 2, 2]}
    assert first["moe_imbalance_layer0"] == 3.0 and first["moe_imbalance_layer2"] == 1.0
    assert first["moe_max_imbalance"] == 3.0 and first["moe_aux_loss"] == 0.5
    second = load.add(["layer0", "layer2"], table([0, 2, 2, 4], [4, 0, 2, 2]))
    assert second[KEY] == {"layer0": [0, 2, 2, 4], "layer2": [4, 0, 2, 2]}
    summary = load.summary()
    assert summary[KEY] == {"layer0": [6, 4, 2, 4], "layer2": [6, 2, 4, 4]}
    assert summary["moe_imbalance"] == {"layer0": pytest.approx(1.5), "layer2": pytest.approx(1.5)}


def write_metrics(run_dir, rows: dict[int, dict[str, list[int]]]) -> None:
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    for step, load in rows.items():
        metrics.write({"step": step, "loss": 5.0, KEY: load})
    metrics.write({"step": max(rows) + 1, "loss": 4.0})  # a record without the field (not a column)
    metrics.close()


def red_pixels(path) -> int:
    """Pixels of a saturated red (the colour scale's crowded end; white at balance, blue below) in the panels (the
    left 85% of the figure: the colour bar, which shows every colour, is on the right)."""
    with Image.open(path) as image:
        panels = image.convert("RGB").crop((0, 0, int(image.width * 0.85), image.height))
        return sum(1 for r, g, b in panels.getdata() if r > 100 and r > 2 * g and r > 2 * b)


def test_the_heatmap_is_drawn_from_metrics_jsonl_when_the_run_ends(tmp_path):
    hot = {s: {"layer0": [10 * s, 2, 2, 2], "layer1": [4, 4, 4, 4], "layer3": [0, 8, 4, 4]} for s in (1, 2, 3)}
    write_metrics(tmp_path, hot)
    summary = {KEY: hot[3], "artifacts": {"images": {"rank_map": "rank_map.png"}, "files": ["trace.json"]}}
    announce_expert_load(run_dir=tmp_path, summary=summary)
    png = tmp_path / FILE
    assert summary["artifacts"] == {"images": {"rank_map": "rank_map.png", IMAGE: str(png)}, "files": ["trace.json"]}
    assert not png.exists()  # announced: drawn as the run ends (parallel/foundation/figures.py)
    assert png in draw_announced() and png.stat().st_size > 0
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == figure_size_px(3)  # one panel per MoE layer
    assert figure_size_px(3)[1] > figure_size_px(2)[1]
    steps, grid = load_grid(read_metrics(tmp_path / "metrics.jsonl"))
    assert steps == [1, 2, 3] and list(grid) == ["layer0", "layer1", "layer3"]
    assert [row[2] for row in grid["layer0"]] == pytest.approx([30 / 9, 2 / 9, 2 / 9, 2 / 9])  # step 3 over its mean
    assert grid["layer1"] == [[1.0] * 3] * 4 and grid["layer3"][0] == [0.0] * 3
    assert red_pixels(png) > 500  # layer0's expert 0 at 3-3.3x its mean

    balanced = tmp_path / "balanced.png"
    draw_expert_load([{"step": 1, KEY: {"layer0": [4, 4, 4, 4]}}], balanced)
    with Image.open(balanced) as image:
        assert image.size == figure_size_px(1)
    assert red_pixels(balanced) == 0


def test_a_run_without_experts_announces_nothing(tmp_path):
    summary = {"first_loss": 5.0}
    announce_expert_load(run_dir=tmp_path, summary=summary)
    assert summary == {"first_loss": 5.0} and tmp_path / FILE not in draw_announced()
    with pytest.raises(ValueError, match=KEY):
        draw_expert_load([{"step": 1, "loss": 5.0}], tmp_path / FILE)
