"""The mesh dimensions, once: name, place in the device mesh, config key, what each splits, whose ranks it borrows.

Everything that spells the degrees reads ``DIMENSIONS`` through the functions below, at call time: the
layout (world size, coordinates, rank map, factorizations), the registry (which strategy trains a
layout), validation (each ``<dim>.size``, a borrowed degree that does not divide its lenders), the worker's
and the dry run's ``DeviceMesh``, the derived meshes (``parallel/foundation/meshes.py``: FSDP's, the loss's, the
experts') and the planner's ``Candidate``. A dimension either multiplies the world size (dp, tp, pp, cp:
its own place in the world mesh) or borrows its ranks from others (ep from dp x cp, as torchtitan cuts
expert parallel out of its data-parallel ranks): a borrowed dimension adds no rank, its degree divides the
product of its lenders', and the ranks its groups leave form its own FSDP mesh. What is still written per
dimension is its config class, the wrapper that applies it and its cost-model term
(docs/adding-a-mesh-dimension.md). No torch import: validation and the planner read this.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class MeshDim:
    name: str
    """The ``DeviceMesh`` dimension name, the rank map's column and the attribute ``layout.<name>``."""
    mesh_place: int | None
    """Position in the world mesh, outermost first; None for a dimension that borrows (it has no place of
    its own). Global ranks are row-major over the mesh, so the innermost dimension's neighbours are adjacent
    ranks and share a node first."""
    key: str
    """The config key holding the degree (``dp.size``)."""
    config: str
    """The schema class of the config group holding ``key`` (``parallel/config.py``)."""
    summary: str
    borrows: tuple[str, ...] = ()
    """Empty: the dimension multiplies the world size. Otherwise the dimensions whose ranks it reuses (ep:
    ``("dp", "cp")``): its degree divides their product, and its groups are cut out of their flattened mesh."""
    may_borrow: tuple[str, ...] = ()
    """Dimensions it borrows too where the model asks (ep: ``("tp",)``, torchtitan's experts without their
    own tensor parallel), named to ``lenders(name, asked=...)``."""
    splits_data: bool = False
    """Its ranks see different tokens (dp: samples, cp: sequence chunks): the loss is averaged, the dense
    gradients reduced and FSDP shards over the product of these dimensions."""
    splits_sequence: bool = False
    """Its ranks hold different chunks of each sample's sequence (cp): what needs a sample's whole sequence on
    one rank (packed documents' attention mask) refuses a size > 1; a preference row's log-probability is summed
    over its ranks (``parallel/foundation/meshes.py`` ``sequence_mesh``)."""
    needs_fsdp: str = ""
    """Why the data dimensions beside it (its size > 1) are FSDP2 ``fully_shard``, never DDP; "" when DDP
    works beside it (``layout.dp_needs_fsdp``)."""
    metrics: tuple[str, ...] = ()
    """The prefixes of the step metrics its meter logs (W&B's ``comm`` group); ``<first>_fraction`` is its share
    of a step."""
    label: str = ""
    """How the console names that share (``tp comm 12%``); "" for none."""
    technique: str = ""
    """The module that applies it beside the others (``compose``); "" for dp, tp and pp, which the strategies name
    themselves."""
    rules: str = ""
    """The module whose ``problems(run, strategy)`` says what it needs of the run, checked before any worker starts
    (no torch import: a refusal stays quick); "" for dp, tp and pp."""

    @property
    def title(self) -> str:
        """Its name in words, from the summary ("context parallel")."""
        return self.summary.split(":", 1)[0]


#: one row per mesh dimension, in the order the degrees are written (``dp.size=2 tp.size=2 pp.size=2``,
#: factorization tuples, messages); ``mesh_place`` orders the mesh: pp outermost, then dp, cp, tp innermost so
#: that tp neighbours, which communicate inside every layer, share a node, cp's all-to-alls next (torchtitan's
#: order)
DIMENSIONS: tuple[MeshDim, ...] = (
    MeshDim(
        "dp",
        1,
        "dp.size",
        "parallel.config.DPConfig",
        "data parallel: replicas (or FSDP shards) of the model",
        splits_data=True,
        metrics=("dp_comm",),
    ),
    MeshDim(
        "tp",
        3,
        "tp.size",
        "parallel.config.TPConfig",
        "tensor parallel: each layer's matrices split",
        needs_fsdp=(  # seen with torch 2.13 on gloo
            "DDP over tensor-parallel (DTensor) modules fails on torch 2.13 "
            "(aten.cat.default got mixed torch.Tensor and DTensor)"
        ),
        metrics=("tp_comm",),
        label="tp comm",
    ),
    MeshDim(
        "pp",
        0,
        "pp.size",
        "parallel.config.PPConfig",
        "pipeline parallel: consecutive blocks per stage",
        needs_fsdp=(
            "DDP inside a PipelineStage with several micro-batches fails on torch 2.13 (reducer.cpp: rebuilt "
            "parameter indices size is not same as original model parameters size; with static_graph it runs "
            "but the gradients are 2% off)"
        ),
    ),
    MeshDim(
        "cp",
        2,
        "cp.size",
        "parallel.config.CPConfig",
        "context parallel: each sample's sequence split into contiguous chunks",
        splits_data=True,
        splits_sequence=True,
        metrics=("cp_comm", "cp_collectives"),
        label="cp all-to-all",
        technique="parallel.techniques.cp",
        rules="parallel.techniques.cp_rules",
    ),
    MeshDim(
        "ep",
        None,
        "ep.size",
        "parallel.config.EPConfig",
        "expert parallel: each MoE layer's experts split, tokens sent to them by all-to-all",
        borrows=("dp", "cp"),
        may_borrow=("tp",),
        needs_fsdp=(
            "the experts are sharded over ep and reduced over their own FSDP2 mesh; DDP would all-reduce every "
            "rank's different experts over dp"
        ),
        metrics=("ep_a2a",),
        label="ep a2a",
        technique="parallel.techniques.ep",
        rules="parallel.techniques.ep_rules",
    ),
)


_names_of: tuple[tuple[MeshDim, ...], tuple[str, ...]] | None = None
"""(the table, its names): every Candidate the planner makes asks for them."""


def names() -> tuple[str, ...]:
    """The dimension names in written order (``dp``, ``tp``, ``pp``), borrowing ones included (worked out once per
    table: a table swapped in, as tests do, is read anew)."""
    global _names_of
    if _names_of is None or _names_of[0] is not DIMENSIONS:
        _names_of = (DIMENSIONS, tuple(d.name for d in DIMENSIONS))
    return _names_of[1]


def multiplying() -> tuple[str, ...]:
    """The dimensions whose degrees multiply the world size, in written order (every row without ``borrows``)."""
    return tuple(d.name for d in DIMENSIONS if not d.borrows)


#: the dimensions every layout message, run tag and suggested layout names, even at size 1 (``dp.size=4 x tp.size=1
#: x pp.size=1``, ``dp4 tp1 pp1``; a ``parallel=`` option sets its own degrees for them); the others when used
ALWAYS_NAMED = ("dp", "tp", "pp")


def named(sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The multiplying dimensions a layout's message or tag names: ``ALWAYS_NAMED``, and any other of size > 1
    (a borrowing one, ep, adds no rank), in written order."""
    return tuple(n for n in multiplying() if n in ALWAYS_NAMED or int(sizes.get(n, 1)) > 1)


def borrowing() -> tuple[str, ...]:
    """The dimensions that borrow their ranks from others, in written order (ep)."""
    return tuple(d.name for d in DIMENSIONS if d.borrows)


_mesh_names_of: tuple[tuple[MeshDim, ...], tuple[str, ...]] | None = None
"""(the table, its mesh names): the planner asks for them half a million times per plan."""


def mesh_names() -> tuple[str, ...]:
    """The world mesh's dimension names, outermost first (``pp``, ``dp``, ``tp``): ``mesh_dim_names``. A
    borrowing dimension has no place there: its meshes are derived (``parallel/foundation/meshes.py``). Worked out once
    per table (a table swapped in, as tests do, is checked anew)."""
    global _mesh_names_of
    if _mesh_names_of is not None and _mesh_names_of[0] is DIMENSIONS:
        return _mesh_names_of[1]
    rows = [d for d in DIMENSIONS if not d.borrows]
    places = sorted(d.mesh_place for d in rows if d.mesh_place is not None)
    if places != list(range(len(rows))):
        raise ValueError(
            f"parallel/foundation/dims.py: mesh places {[(d.name, d.mesh_place) for d in rows]} must be "
            f"0..{len(rows) - 1}, each once; renumber them"
        )
    placed = [d.name for d in DIMENSIONS if d.borrows and d.mesh_place is not None]
    if placed:
        raise ValueError(f"parallel/foundation/dims.py: {placed} borrow their ranks, so their mesh_place must be None")
    found = tuple(d.name for d in sorted(rows, key=lambda d: d.mesh_place))
    _mesh_names_of = (DIMENSIONS, found)
    return found


def coord_names() -> tuple[str, ...]:
    """The rank map's coordinate columns: the world mesh's dimensions, then the borrowing ones."""
    return (*mesh_names(), *borrowing())


def dim(name: str) -> MeshDim:
    for d in DIMENSIONS:
        if d.name == name:
            return d
    raise KeyError(f"no mesh dimension {name!r}; the dimensions are {', '.join(names())} (parallel/foundation/dims.py)")


def lenders(name: str, *, asked: Iterable[str] = ()) -> tuple[str, ...]:
    """The dimensions in the table whose ranks ``name`` borrows, in mesh order: its ``borrows`` and those of
    its ``may_borrow`` the model asks for (``asked``); a lender not in the table (cp before it lands) is left
    out, having size 1."""
    row = dim(name)
    if not row.borrows:
        raise ValueError(f"{name} multiplies the world size; it borrows no ranks")
    refused = [a for a in asked if a not in row.may_borrow]
    if refused:
        raise ValueError(f"{name} may borrow {list(row.may_borrow)} where the model asks, not {refused}")
    wanted = {*row.borrows, *asked}
    return tuple(n for n in mesh_names() if n in wanted)


def data_names() -> tuple[str, ...]:
    """The world mesh's dimensions whose ranks see different tokens (dp, cp), in mesh order: the loss is
    averaged, the dense gradients reduced and FSDP shards over their product."""
    return tuple(n for n in mesh_names() if dim(n).splits_data)


def spanned(over: Iterable[str], sizes: Mapping[str, int]) -> tuple[str, ...]:
    """Which of ``over`` (mesh order) a derived mesh spans: those of size > 1, or the first alone when all are 1
    (so the FSDP mesh is ``mesh["dp"]`` itself while dp is the only data dimension > 1, as training had it)."""
    over = tuple(over)
    used = tuple(n for n in over if int(sizes.get(n, 1)) > 1)
    return used or over[:1]


def full_sizes(given: Mapping[str, int]) -> dict[str, int]:
    """Every dimension's size in written order, 1 where ``given`` has none; a name not in the table is refused."""
    known = names()
    if tuple(given) == known:  # already every dimension, in order (the planner's candidates)
        return {n: int(v) for n, v in given.items()}
    unknown = [k for k in given if k not in known]
    if unknown:
        raise TypeError(f"unknown mesh dimension(s) {unknown}; the dimensions are {', '.join(known)}")
    return {n: int(given.get(n, 1)) for n in known}


def world_size(sizes: Mapping[str, int]) -> int:
    """The number of ranks: the product of the multiplying dimensions' degrees (a borrowing one adds none)."""
    return math.prod(int(sizes.get(n, 1)) for n in multiplying())


def in_mesh_order(sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The sizes as the world ``DeviceMesh``'s shape (``mesh_names()`` order)."""
    return tuple(int(sizes.get(n, 1)) for n in mesh_names())


def lent(name: str, sizes: Mapping[str, int], *, asked: Iterable[str] = ()) -> int:
    """How many ranks ``name`` borrows from: the product of its lenders' degrees."""
    return math.prod(int(sizes.get(n, 1)) for n in lenders(name, asked=asked))


def borrow_problems(sizes: Mapping[str, int], *, asked: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """Each borrowing dimension whose degree does not divide its lenders' product, as "what is wrong; the
    fix" (``asked``: the lenders the model asks for, by dimension)."""
    out = []
    for name in borrowing():
        size, extra = int(sizes.get(name, 1)), tuple((asked or {}).get(name, ()))
        pool = lent(name, sizes, asked=extra)
        if size >= 1 and pool % size:
            named = spanned(lenders(name, asked=extra), sizes)  # the lenders in use (dp alone while cp is 1)
            product = " x ".join(f"{dim(n).key}={int(sizes.get(n, 1))}" for n in named)
            fits = [d for d in range(1, pool + 1) if pool % d == 0]
            out.append(
                f"{dim(name).key}={size} does not divide {product} = {pool}, the ranks {name} borrows "
                f"(it adds none of its own); set {dim(name).key} to one of {', '.join(map(str, fits))}, "
                f"or change {' / '.join(dim(n).key for n in named)} so that {size} divides their product"
            )
    return out


def nearest_multiples(value: int, base: int) -> str:
    """The multiples of ``base`` around ``value`` ("14 or 16" for 15 and 2): the fix a divisibility rule names."""
    lo = (value // base) * base
    hi = lo + base
    return str(hi) if lo < base else f"{lo} or {hi}"


def factorizations(world_size: int) -> list[tuple[int, ...]]:
    """Every layout of ``world_size`` ranks, as tuples in written order: the multiplying dimensions' degrees
    multiply to ``world_size``, each borrowing dimension's divides its lenders' product. The first dimensions
    largest first (data parallel first)."""

    def split(n: int, left: int) -> Iterable[tuple[int, ...]]:
        if left == 1:
            yield (n,)
            return
        for d in range(1, n + 1):
            if n % d == 0:
                for rest in split(n // d, left - 1):
                    yield (d, *rest)

    out = []
    for degrees in split(world_size, len(multiplying())):
        partial = [dict(zip(multiplying(), degrees, strict=True))]
        for name in borrowing():
            pool = lent(name, partial[0])
            partial = [{**p, name: d} for p in partial for d in range(1, pool + 1) if pool % d == 0]
        out += [tuple(p[n] for n in names()) for p in partial]
    return sorted(out, key=lambda t: tuple(-s for s in t))


def borrowed_coords(name: str, coords: Mapping[str, int], sizes: Mapping[str, int]) -> tuple[int, int]:
    """A rank's (``name`` coordinate, coordinate in ``name``'s own FSDP mesh), from its world coordinates: its
    lenders flattened row-major (mesh order), ``name`` the inner factor so its groups are neighbours."""
    flat = 0
    for n in lenders(name):
        flat = flat * int(sizes.get(n, 1)) + coords[n]
    size = int(sizes.get(name, 1))
    return flat % size, flat // size


class Sized:
    """Degrees per dimension (a ``sizes`` mapping) and what follows from them: world size, mesh shape,
    coordinates. For frozen dataclasses decorated with ``with_dim_kwargs``, which lets their constructor
    take the degrees by name (``ParallelLayout(strategy="hybrid", dp=2, tp=2)``) and sets each as a plain
    attribute (``layout.dp``)."""

    sizes: dict[str, int]

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: a dimension added to the table after this object was made
        if not name.startswith("_") and name in names():
            return 1
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def size(self, name: str) -> int:
        if name in self.sizes:
            return self.sizes[name]
        dim(name)  # refuses a name that is not a dimension
        return 1  # a dimension added to the table after this object was made

    @property
    def world_size(self) -> int:
        return world_size(self.sizes)

    @property
    def data_size(self) -> int:
        """The ranks that see different tokens of a step: the product of the data dimensions' degrees (``data_names``)."""
        return math.prod(self.size(n) for n in data_names())

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return in_mesh_order(self.sizes)

    def stride(self, name: str) -> int:
        """Ranks between neighbours along dimension ``name``: the product of the sizes inside it in the mesh
        (1 for the innermost, tp; dp x tp for pp). With ``size`` it says whether a group spans nodes."""
        if dim(name).borrows:
            raise ValueError(f"{name} borrows its ranks from {lenders(name)}: ask their strides")
        inner = mesh_names()[mesh_names().index(name) + 1 :]
        return math.prod(self.size(n) for n in inner)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """``init_device_mesh``'s names for ``mesh_shape``."""
        return mesh_names()

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over the world mesh: the innermost dimension varies
        fastest), then each borrowing dimension's (``borrowed_coords``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        out = {}
        for name in reversed(mesh_names()):
            rank, out[name] = divmod(rank, self.size(name))
        world = {name: out[name] for name in mesh_names()}
        return {**world, **{n: borrowed_coords(n, world, self.sizes)[0] for n in borrowing()}}

    def rank_of(self, **coords: int) -> int:
        """The global rank at these mesh coordinates (one per world mesh dimension, by name; a borrowing
        dimension's coordinate, as ``coords`` gives it, may come along and follows from the others)."""
        if not set(mesh_names()) <= set(coords) <= set(coord_names()):
            raise TypeError(f"rank_of needs one coordinate per mesh dimension {mesh_names()}; got {coords}")
        rank = 0
        for name in mesh_names():
            rank = rank * self.size(name) + coords[name]
        return rank

    def flat_dict(self) -> dict[str, Any]:
        """The fields as a plain dict with ``sizes`` spread in its place (``dp``, ``tp``, ``pp`` keys)."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():  # type: ignore[call-overload]
            if key == "sizes":
                out.update(full_sizes(value))
            else:
                out[key] = value
        return out


def with_dim_kwargs(cls):
    """Class decorator (after ``@dataclass``): the constructor also takes each dimension's degree by name
    and folds it into ``sizes``, filled to every dimension in written order."""
    init = cls.__init__

    def __init__(self, *args: Any, sizes: Mapping[str, int] | None = None, **kwargs: Any) -> None:
        given = dict(sizes or {})
        for n in names():
            if n in kwargs:
                given[n] = kwargs.pop(n)
        sizes = full_sizes(given)
        init(self, *args, sizes=sizes, **kwargs)
        for name, size in sizes.items():  # plain attributes: read on every step and in the planner's loops
            object.__setattr__(self, name, size)

    __init__.__doc__ = init.__doc__
    cls.__init__ = __init__
    return cls
