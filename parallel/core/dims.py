"""The mesh dimensions, once: name, place in the device mesh, config key, what each splits.

Everything that spells the degrees reads ``DIMENSIONS`` through the functions below, at call time: the
layout (world size, coordinates, rank map, factorizations), the registry (which strategy trains a
layout), validation (each ``<dim>.size``), the worker's and the dry run's ``DeviceMesh`` and the planner's
``Candidate``. Adding a dimension (context parallel, expert parallel) is one row here; what is still
written per dimension is its config class, the wrapper that applies it and its cost-model term
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
    mesh_place: int
    """Position in the device mesh, outermost first. Global ranks are row-major over the mesh, so the
    innermost dimension's neighbours are adjacent ranks and share a node first."""
    key: str
    """The config key holding the degree (``dp.size``)."""
    config: str
    """The schema class of the config group holding ``key`` (``parallel/config.py``)."""
    summary: str


#: one row per mesh dimension, in the order the degrees are written (``dp.size=2 tp.size=2 pp.size=2``,
#: factorization tuples, messages); ``mesh_place`` orders the mesh: pp outermost, tp innermost so that tp
#: neighbours, which communicate inside every layer, share a node (as Megatron and torchtitan order them)
DIMENSIONS: tuple[MeshDim, ...] = (
    MeshDim("dp", 1, "dp.size", "parallel.config.DPConfig", "data parallel: replicas (or FSDP shards) of the model"),
    MeshDim("tp", 2, "tp.size", "parallel.config.TPConfig", "tensor parallel: each layer's matrices split"),
    MeshDim("pp", 0, "pp.size", "parallel.config.PPConfig", "pipeline parallel: consecutive blocks per stage"),
)


def names() -> tuple[str, ...]:
    """The dimension names in written order (``dp``, ``tp``, ``pp``)."""
    return tuple(d.name for d in DIMENSIONS)


def mesh_names() -> tuple[str, ...]:
    """The dimension names in mesh order, outermost first (``pp``, ``dp``, ``tp``): ``mesh_dim_names``."""
    places = sorted(d.mesh_place for d in DIMENSIONS)
    if places != list(range(len(DIMENSIONS))):
        raise ValueError(
            f"parallel/core/dims.py: mesh places {[(d.name, d.mesh_place) for d in DIMENSIONS]} must be "
            f"0..{len(DIMENSIONS) - 1}, each once; renumber them"
        )
    return tuple(d.name for d in sorted(DIMENSIONS, key=lambda d: d.mesh_place))


def dim(name: str) -> MeshDim:
    for d in DIMENSIONS:
        if d.name == name:
            return d
    raise KeyError(f"no mesh dimension {name!r}; the dimensions are {', '.join(names())} (parallel/core/dims.py)")


def full_sizes(given: Mapping[str, int]) -> dict[str, int]:
    """Every dimension's size in written order, 1 where ``given`` has none; a name not in the table is refused."""
    unknown = [k for k in given if k not in names()]
    if unknown:
        raise TypeError(f"unknown mesh dimension(s) {unknown}; the dimensions are {', '.join(names())}")
    return {n: int(given.get(n, 1)) for n in names()}


def in_mesh_order(sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The sizes as a ``DeviceMesh`` shape (``mesh_names()`` order)."""
    return tuple(int(sizes.get(n, 1)) for n in mesh_names())


def factorizations(world_size: int) -> list[tuple[int, ...]]:
    """Every way to write ``world_size`` as a product of one degree per dimension, as tuples in written
    order, the first dimensions largest first (data parallel first)."""

    def split(n: int, left: int) -> Iterable[tuple[int, ...]]:
        if left == 1:
            yield (n,)
            return
        for d in range(1, n + 1):
            if n % d == 0:
                for rest in split(n // d, left - 1):
                    yield (d, *rest)

    return sorted(split(world_size, len(DIMENSIONS)), key=lambda t: tuple(-s for s in t))


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
        return math.prod(self.sizes.values())

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return in_mesh_order(self.sizes)

    def stride(self, name: str) -> int:
        """Ranks between neighbours along dimension ``name``: the product of the sizes inside it in the mesh
        (1 for the innermost, tp; dp x tp for pp). With ``size`` it says whether a group spans nodes."""
        inner = mesh_names()[mesh_names().index(dim(name).name) + 1 :]
        return math.prod(self.size(n) for n in inner)

    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        """``init_device_mesh``'s names for ``mesh_shape``."""
        return mesh_names()

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank (row-major over the mesh: the innermost dimension varies fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        out = {}
        for name in reversed(mesh_names()):
            rank, out[name] = divmod(rank, self.size(name))
        return {name: out[name] for name in mesh_names()}

    def rank_of(self, **coords: int) -> int:
        """The global rank at these mesh coordinates (one per dimension, by name)."""
        if sorted(coords) != sorted(mesh_names()):
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
