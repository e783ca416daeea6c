"""The meshes derived from the world mesh by the dimension table (``parallel/foundation/dims.py``).

The world mesh has one dimension per multiplying row (pp, dp, cp, tp). What the techniques shard or reduce
over is cut out of it with DeviceMesh's own operations, never by listing ranks: the FSDP mesh and the loss
and gradient-reduction mesh are the data dimensions (dp x cp) flattened; an expert mesh (ep) is its lenders
flattened and unflattened into (what is left, ep), the first of which is the experts' own FSDP mesh, as
torchtitan builds them. Flattening caches on the root mesh, so asking twice costs no new process group, and
a derived mesh spanning one dimension is that dimension's slice itself (today's ``mesh["dp"]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from torch.distributed.device_mesh import DeviceMesh

from parallel.foundation import dims


def flat_mesh(world_mesh: DeviceMesh, over: Iterable[str], sizes: Mapping[str, int]) -> DeviceMesh:
    """One 1-D mesh over the product of ``over`` (mesh order; ``dims.spanned`` drops those of size 1): the slice
    itself for one dimension, else the slice by several names flattened, named ``dp_cp``."""
    names = dims.spanned(over, sizes)
    if len(names) == 1:
        return world_mesh[names[0]]
    return world_mesh[names]._flatten("_".join(names))


def fsdp_mesh(world_mesh: DeviceMesh, sizes: Mapping[str, int]) -> DeviceMesh:
    """The mesh FSDP2 shards the dense parameters over: the data dimensions (dp x cp), ``mesh["dp"]`` while
    dp is the only one > 1."""
    return flat_mesh(world_mesh, dims.data_names(), sizes)


def sequence_mesh(world_mesh: DeviceMesh, sizes: Mapping[str, int]) -> DeviceMesh | None:
    """The ranks that hold chunks of the same samples (the dimensions that split a sample's sequence,
    ``MeshDim.splits_sequence``: cp), flattened; None when none of them is in use."""
    names = dims.spanned([d.name for d in dims.DIMENSIONS if d.splits_sequence], sizes)
    return flat_mesh(world_mesh, names, sizes) if names else None


def loss_mesh(world_mesh: DeviceMesh, sizes: Mapping[str, int]) -> DeviceMesh:
    """The mesh the loss is averaged and the dense gradients are reduced over (DDP's group): the ranks that see
    different tokens, dp x cp. It is FSDP's mesh while the table has no replicated-and-sharded (HSDP) split."""
    return flat_mesh(world_mesh, dims.data_names(), sizes)


def expert_meshes(
    world_mesh: DeviceMesh, sizes: Mapping[str, int], *, name: str, asked: Iterable[str] = ()
) -> tuple[DeviceMesh, DeviceMesh]:
    """(the ``name`` mesh, its own FSDP mesh): the lenders (ep: dp x cp, and tp where the model asks) flattened,
    then unflattened into (lent / ep, ep), ep inner so that its all-to-all stays between neighbouring ranks. The
    FSDP mesh is the complement: the lenders' ranks that hold the same experts. ``dims.borrow_problems``
    refuses a degree that does not divide the lenders' product before any process starts."""
    asked = tuple(asked)
    size = int(sizes.get(name, 1))
    pool = dims.lent(name, sizes, asked=asked)
    problems = dims.borrow_problems(sizes, asked={name: asked})
    if problems:
        raise ValueError("; ".join(problems))
    lenders = dims.lenders(name, asked=asked)
    split = flat_mesh(world_mesh, lenders, sizes)._unflatten(0, (pool // size, size), (f"{name}_fsdp", name))
    return split[name], split[f"{name}_fsdp"]
