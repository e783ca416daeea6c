"""The mesh dimensions are one table (parallel/foundation/dims.py): today's rank order is pinned, a row added to the
table alone (a hypothetical ``xp``) brings its config group, and context parallel's row (``cp``, added as a row
of the table) reaches the layout, the rank map, the factorizations, the planner's candidates, validation and a
DeviceMesh."""

from __future__ import annotations

import functools
import importlib
import pickle
from dataclasses import dataclass, fields, make_dataclass, replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from parallel.assembly.registry import describe_factorization, strategy_for
from parallel.foundation import dims
from parallel.foundation.dims import MeshDim
from parallel.foundation.layout import ParallelLayout, factorizations
from parallel.plan.cost_model import Candidate
from tests.helpers import ROOT


def test_todays_dimensions_and_rank_order():
    assert dims.names() == ("dp", "tp", "pp", "cp", "ep")
    assert dims.mesh_names() == ("pp", "dp", "cp", "tp")  # ep borrows dp's ranks: no place of its own
    assert [dims.dim(n).key for n in dims.names()] == ["dp.size", "tp.size", "pp.size", "cp.size", "ep.size"]
    layout = ParallelLayout(strategy="hybrid", dp=2, tp=3, pp=2, nproc_per_node=6)
    assert layout.world_size == 12 and layout.mesh_shape == (2, 2, 1, 3)
    assert (layout.dp, layout.tp, layout.pp, layout.cp) == (2, 3, 2, 1)
    assert [layout.stride(n) for n in ("tp", "dp", "pp")] == [1, 3, 6]  # ranks between group neighbours
    for r in range(12):  # row-major over (pp, dp, cp, tp): tp varies fastest
        assert layout.coords(r) == {"pp": r // 6, "dp": (r // 3) % 2, "cp": 0, "tp": r % 3, "ep": 0}
        assert layout.rank_of(**layout.coords(r)) == r
    assert list(layout.to_dict())[:5] == ["strategy", "dp", "tp", "pp", "cp"]
    assert pickle.loads(pickle.dumps(layout)) == layout  # spawned workers receive it pickled
    assert replace(layout, dp=1).world_size == 6 and replace(layout, nnodes=2).sizes == layout.sizes
    assert factorizations(2) == [
        (2, 1, 1, 1, 2), (2, 1, 1, 1, 1), (1, 2, 1, 1, 1), (1, 1, 2, 1, 1), (1, 1, 1, 2, 2), (1, 1, 1, 2, 1),
    ]  # fmt: skip
    assert describe_factorization(2, 1, 2, 1, 1) == "parallel=hybrid dp.size=2 pp.size=2"
    assert describe_factorization(2, 1, 1, 1, 2) == "parallel=hybrid dp.size=2 ep.size=2"


def test_each_row_names_its_config_class_and_the_root_schema_holds_it():
    from conf.schema import MeshtrainConfig

    root = {f.name: f for f in fields(MeshtrainConfig)}
    for d in dims.DIMENSIONS:
        module, _, name = d.config.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        group, _, leaf = d.key.partition(".")
        assert leaf == "size" and "size" in {f.name for f in fields(cls)}, d
        assert root[group].default_factory is cls, d


@dataclass
class XPConfig:
    """A new dimension's config group, defined in its own module (here: this test)."""

    size: int = 1


def test_a_new_rows_config_group_joins_the_root_schema_without_editing_it(monkeypatch):
    from conf.schema import _dimension_groups

    row = MeshDim("xp", 4, "xp.size", f"{__name__}.XPConfig", "a hypothetical fifth dimension")
    monkeypatch.setattr(dims, "DIMENSIONS", (*dims.DIMENSIONS, row))
    groups = {name: (cls, f) for name, cls, f in _dimension_groups()}
    assert list(groups) == ["dp", "tp", "pp", "cp", "ep", "xp"] and groups["xp"][0] is XPConfig
    root = make_dataclass("Root", [(name, cls, f) for name, (cls, f) in groups.items()])
    cfg = OmegaConf.merge(OmegaConf.structured(root), OmegaConf.from_dotlist(["xp.size=2"]))
    assert cfg.xp.size == 2 and cfg.dp.size == 1
    with pytest.raises(Exception, match="size"):  # typed: a string is refused at compose
        OmegaConf.merge(OmegaConf.structured(root), OmegaConf.from_dotlist(["xp.size=two"]))


def test_sizes_refuse_an_unknown_dimension_and_a_bad_table(monkeypatch):
    with pytest.raises(TypeError, match="unknown mesh dimension.*'xp'.*dp, tp, pp, cp"):
        dims.full_sizes({"xp": 2})
    with pytest.raises(TypeError, match="one coordinate per mesh dimension"):
        ParallelLayout(strategy="ddp", dp=2).rank_of(dp=1)
    twice = tuple(MeshDim(d.name, 0, d.key, d.config, d.summary) for d in dims.DIMENSIONS if not d.borrows)
    monkeypatch.setattr(dims, "DIMENSIONS", twice)
    with pytest.raises(ValueError, match="mesh places .* must be 0..3, each once"):
        dims.mesh_names()


def test_cp_reaches_layout_and_rank_map():
    """Context parallel between dp and tp in the mesh (torchtitan's order: pp, dp, cp, tp)."""
    assert dims.names() == ("dp", "tp", "pp", "cp", "ep") and dims.mesh_names() == ("pp", "dp", "cp", "tp")
    layout = ParallelLayout(strategy="hybrid", dp=2, tp=2, pp=2, cp=2, nnodes=2, nproc_per_node=8)
    assert layout.cp == 2 and layout.world_size == 16 and layout.mesh_shape == (2, 2, 2, 2)
    assert layout.mesh_dim_names == ("pp", "dp", "cp", "tp")
    rows = layout.rank_map()
    assert [r["rank"] for r in rows] == list(range(16))
    for r in rows:
        coords = {k: r[k] for k in layout.mesh_dim_names}
        assert layout.rank_of(**coords) == r["rank"]
        assert coords == {"pp": r["rank"] // 8, "dp": r["rank"] // 4 % 2, "cp": r["rank"] // 2 % 2, "tp": r["rank"] % 2}
    assert layout.to_dict()["cp"] == 2
    assert [layout.stride(n) for n in ("tp", "cp", "dp", "pp")] == [1, 2, 4, 8]
    assert ParallelLayout(strategy="ddp", dp=2).cp == 1  # not given: size 1
    from parallel.plan.dry_run import sample_ranks

    assert sample_ranks(**layout.sizes) == [0, 7, 8, 15]  # each stage's first and last rank; the middle is 15


def test_cp_reaches_factorizations_strategies_and_candidates(compose_cfg):
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.search import enumerate_candidates, plan, strategy_of

    four = [t[:4] for t in factorizations(4) if t[4] == 1]  # ep = 1: the multiplying degrees alone
    assert len(four) == 10 and all(t[0] * t[1] * t[2] * t[3] == 4 for t in four)
    assert four[0] == (4, 1, 1, 1) and (1, 1, 1, 4) in four and (2, 1, 1, 2) in four
    assert strategy_for(dp=2, cp=2) == "hybrid"
    assert strategy_for(cp=2) == "hybrid"  # no strategy of its own yet: hybrid composes it
    assert strategy_for(dp=2, zero_stage=3) == "fsdp" and strategy_for(tp=2) == "tp"  # today's picks unchanged
    assert describe_factorization(2, 1, 1, 2, 1) == "parallel=hybrid dp.size=2 cp.size=2"
    c = Candidate(dp=2, cp=2, micro_batches=2)
    assert c.world_size == 4 and c.cp == 2 and c.coords(3) == {"pp": 0, "dp": 1, "cp": 1, "tp": 0, "ep": 0}
    assert c.flat_dict()["cp"] == 2 and strategy_of(c) == "hybrid"

    cfg = compose_cfg("model=gpt_small", "topology.nproc_per_node=4", "data.global_batch_size=8")
    model, hardware, workload = specs_from_cfg(cfg)
    assert hardware.world_size == 4
    cands = list(enumerate_candidates(model=model, hardware=hardware, workload=workload))
    assert {tuple(c.sizes) for c in cands} == {("dp", "tp", "pp", "cp", "ep")}
    assert all(c.world_size == 4 for c in cands)
    assert {c.cp for c in cands} == {1, 2, 4}
    ranked = plan(model=model, hardware=hardware, workload=workload).ranked
    assert ranked and all(e.candidate.cp == 1 for e in ranked)  # cp is ranked where nothing without it fits
    assert "cp" in ranked[0].to_dict()
    # (at 128k tokens, where nothing else fits, it is: tests/system/test_planner_full_size.py)


def test_cp_reaches_validation(compose_cfg):
    from trainer.validate import ConfigError, build_layout, validate

    cfg = compose_cfg("parallel=ddp", "dp.size=2", "topology.nproc_per_node=4", "cp.size=2")
    assert build_layout(cfg).sizes == {"dp": 2, "tp": 1, "pp": 1, "cp": 2, "ep": 1}
    with pytest.raises(ConfigError, match="cp.size=2 with parallel=ddp: ddp does not use the cp dimension"):
        validate(cfg)
    cfg.cp.size = 0
    with pytest.raises(ConfigError, match=r"cp.size=0: must be a positive integer"):
        validate(cfg)


def test_cp_reaches_the_device_mesh():
    """What the worker does (trainer/launch/worker.py), under a fake process group of 16 ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    layout = ParallelLayout(strategy="hybrid", dp=2, tp=2, pp=2, cp=2)
    dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=layout.world_size)
    try:
        mesh = init_device_mesh("cpu", layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names)
        assert mesh.mesh_dim_names == ("pp", "dp", "cp", "tp")
        assert {n: mesh[n].size() for n in layout.mesh_dim_names} == {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
        coords = layout.coords(5)
        assert {n: mesh.get_local_rank(n) for n in layout.mesh_dim_names} == {n: coords[n] for n in mesh.mesh_dim_names}
    finally:
        dist.destroy_process_group()


#: docs/adding-a-mesh-dimension.md's section listing, per dimension, the files that name it
DIMENSION_DOC = ROOT / "docs" / "adding-a-mesh-dimension.md"
DIMENSION_SECTION = "## Where each dimension is named today, file by file"


def files_naming(dim: str, root: Path = ROOT) -> set[str]:
    """Product files whose code names ``dim``: a name ``dim``, ``dim_...``, ``..._dim`` or ``..._dim_...``, or a
    string constant ``dim``, ``dim.size``, ``dim_...`` (comments and docstrings are not code). A file none of whose
    words (comments and docstrings included) is such a name is not parsed: each of those strings is such a word."""
    import re

    name = re.compile(rf"(\w+_)?{dim}(_\w+)?")
    string = re.compile(rf"{dim}([._]\w+)?")
    found = set()
    for package in ("conf", "models", "parallel", "trainer"):
        for path in sorted((root / package).rglob("*.py")):
            if not any(name.fullmatch(w) for w in set(re.findall(r"\w+", path.read_text()))):
                continue
            names, strings = code_words(path, path.stat().st_mtime_ns)
            if any(name.fullmatch(n) for n in names) or any(string.fullmatch(s) for s in strings):
                found.add(path.relative_to(root).as_posix())
    return found


@functools.cache
def code_words(path: Path, mtime_ns: int) -> tuple[frozenset[str], frozenset[str]]:
    """The names (tokens) and string constants of a file's code, read once per version of the file (each dimension's
    check reads every product file)."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    names = frozenset(t.string for t in tokens if t.type == tokenize.NAME)
    strings = frozenset(
        n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )
    return names, strings


def documented_files(dim: str) -> set[str]:
    import re

    section = DIMENSION_DOC.read_text().split(DIMENSION_SECTION, 1)[1]
    part = section.split(f"### {dim}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    return set(re.findall(r"`((?:conf|models|parallel|trainer)/[\w/]+\.py)`", part))


def test_the_dimension_grep_sees_names_and_strings_not_prose(tmp_path):
    (tmp_path / "parallel").mkdir()
    (tmp_path / "parallel" / "prose.py").write_text('"""dp x cp in a docstring."""\n# cp in a comment\nx = 1\n')
    (tmp_path / "parallel" / "name.py").write_text("def f(layout):\n    return layout.cp\n")
    (tmp_path / "parallel" / "key.py").write_text('KEY = "cp.size"\n')
    (tmp_path / "parallel" / "metric.py").write_text('x = {"cp_comm_fraction": 1}\n')
    assert files_naming("cp", tmp_path) == {"parallel/name.py", "parallel/key.py", "parallel/metric.py"}


@pytest.mark.parametrize("dim", ["cp", "ep"])
def test_the_dimension_lists_match_the_code(dim):
    """docs/adding-a-mesh-dimension.md lists every product file that names the dimension, and no other."""
    code, doc = files_naming(dim), documented_files(dim)
    assert code == doc, (
        f"{dim}: named in the code but not in {DIMENSION_DOC.name}: {sorted(code - doc)}; "
        f"listed but no longer named: {sorted(doc - code)}"
    )
