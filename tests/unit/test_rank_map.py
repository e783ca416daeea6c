"""The rank map from a layout and stage modules: every rank once, coordinates row-major (pp, dp, cp, tp)."""

from __future__ import annotations

from parallel.foundation.layout import ParallelLayout
from parallel.foundation.rank_map import draw_rank_map, gather_rank_map, held_layers, short_label


def test_rank_map_rows_cover_every_rank_once_with_mesh_coordinates():
    layout = ParallelLayout(strategy="hybrid", dp=2, tp=2, pp=2, nnodes=2, nproc_per_node=4)
    rows = layout.rank_map()
    assert [r["rank"] for r in rows] == list(range(8))
    seen = {(r["pp"], r["dp"], r["tp"]) for r in rows}
    assert len(seen) == 8  # a bijection onto the mesh
    for r in rows:
        assert layout.rank_of(pp=r["pp"], dp=r["dp"], cp=r["cp"], tp=r["tp"]) == r["rank"]
        assert (r["node"], r["local_rank"]) == divmod(r["rank"], 4)
    # tp peers are neighbours on one node; pipeline stages span the nodes
    assert [(r["node"], r["pp"]) for r in rows] == [(0, 0)] * 4 + [(1, 1)] * 4


def test_held_layers_of_pipeline_stages_and_labels():
    import torch

    from models.gpt.model import GPT
    from parallel.pipeline.stages import StageSpec, build_stage_module

    torch.manual_seed(0)
    model = GPT(n_layers=4, d_model=16, n_heads=2, max_seq_len=8)
    first = build_stage_module(model, spec=StageSpec(index=0, pp_rank=0, start=0, stop=2, first=True, last=False))
    last = build_stage_module(model, spec=StageSpec(index=1, pp_rank=1, start=2, stop=4, first=False, last=True))
    assert held_layers([first]) == ["tok_embeddings", "pos_embeddings", "layers.0", "layers.1"]
    assert held_layers([last]) == ["layers.2", "layers.3", "norm", "output"]
    assert short_label(held_layers([first])) == "emb L0-1"
    assert short_label(held_layers([last])) == "L2-3 head"
    assert short_label(["layers.0", "layers.2", "layers.3"]) == "L0,2-3"


def test_single_process_gather_and_png(tmp_path):
    from models.gpt.model import GPT

    layout = ParallelLayout(strategy="tp", tp=1)
    rows = gather_rank_map(layout=layout, rank=0, stages=[0], modules=[GPT(n_layers=2, d_model=16, n_heads=2)])
    assert rows[0]["holds"] == "emb L0-1 head" and rows[0]["stages"] == [0]
    png = draw_rank_map(rows, nnodes=1, nproc_per_node=1, path=tmp_path / "rank_map.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_announce_prints_the_table_now_and_draws_the_png_when_asked(tmp_path):
    """The PNG (matplotlib's import and the drawing, about a second) waits for ``draw_announced``, which rank 0's
    sinks call as the run finishes: it must not delay the first step."""
    import logging
    from types import SimpleNamespace

    from models.gpt.model import GPT
    from parallel.foundation.figures import draw_announced
    from parallel.foundation.rank_map import announce_rank_map

    ctx = SimpleNamespace(
        layout=ParallelLayout(strategy="tp", tp=1),
        coords={"pp": 0},
        rank=0,
        mesh=None,
        is_rank0=True,
        log=logging.getLogger("test_rank_map"),
        run_dir=tmp_path,
    )
    extras = announce_rank_map(ctx, stage_modules=[GPT(n_layers=2, d_model=16, n_heads=2)])
    png = tmp_path / "rank_map.png"
    assert extras["artifacts"]["images"]["rank_map"] == str(png) and not png.exists()
    assert draw_announced() == [png] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert draw_announced() == []  # drawn once
