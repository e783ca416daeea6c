"""torch's Muon step on whole matrices, wherever the layout put their pieces.

``torch.optim.Muon`` orthogonalises a whole 2-D matrix (Newton-Schulz in bf16); a DTensor shard of FSDP2 or tensor
parallel is not that matrix. Each matrix therefore reaches torch's functional step (``torch.optim._muon.muon``: the
momentum, the orthogonalisation, the learning-rate adjustment and the update, unchanged) whole, in one of three ways:

- **Local** (``local_matrices``): a plain tensor (single, DDP, a pipeline stage), a DTensor replicated on every
  rank, or an experts' 3-D tensor sharded only along the expert dimension (expert parallel, FSDP2 over experts):
  the rank holds whole matrices and steps them where they are. A 3-D tensor is one matrix per expert.
- **Everywhere** (``step_gathered_everywhere``, ``optim.muon_gather=everywhere``): every rank all-gathers the
  parameter, its gradient and its momentum (``full_tensor``), steps the whole matrix and keeps its own part.
- **Spread** (``SpreadStep``, ``optim.muon_gather=spread``, the default): each matrix has one owner among its
  mesh's ranks (largest first to the least loaded); every rank sends each owner its parts of the owner's matrices
  (one gather per owner), the owners step their matrices, and the new parameter and momentum parts go back (one
  scatter per owner). Each matrix is orthogonalised once, not on every rank.

Which rank holds which elements is read from DTensor itself (``distribute_tensor`` of an index matrix with
``src_data_rank=None``: each rank's own part, no communication), so FSDP2's uneven and strided shards and TP's
row or column shards need no case of their own. The owners learn every rank's elements once, at the first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim._muon import muon as torch_muon

#: the settings of a Muon param group that torch's functional step takes
STEP_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "ns_steps", "eps", "adjust_lr_fn")


def step_whole(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor], settings: dict) -> None:
    """torch's functional Muon over whole matrices; a 3-D tensor (experts) as one matrix per leading index."""
    p_list, g_list, b_list = [], [], []
    for p, g, b in zip(params, grads, bufs):
        if p.ndim == 2:
            p_list.append(p), g_list.append(g), b_list.append(b)
        else:
            for e in range(p.shape[0]):
                p_list.append(p[e]), g_list.append(g[e]), b_list.append(b[e])
    if not p_list:
        return
    args = {k: settings[k] for k in STEP_KEYS}
    args["ns_coefficients"] = tuple(args["ns_coefficients"])
    torch_muon(p_list, g_list, b_list, **args, has_complex=False)


def held_whole(p: torch.Tensor) -> bool:
    """Whether this rank holds whole matrices of ``p``: not a DTensor, replicated, or an experts' tensor sharded
    along the expert dimension only."""
    if not isinstance(p, DTensor):
        return True
    dims = [pl.dim for pl in p.placements if pl.is_shard()]
    return not dims or (p.ndim == 3 and all(d == 0 for d in dims))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def local_matrices(entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], settings: dict) -> None:
    """Step the matrices this rank holds whole, where they are."""
    if entries:
        step_whole(*([_local(t) for t in column] for column in zip(*entries)), settings)


def _own_part(full: torch.Tensor, like: DTensor) -> torch.Tensor:
    """This rank's part of ``full`` as ``like`` is placed (no communication)."""
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()


def step_gathered_everywhere(entries: list[tuple[DTensor, DTensor, DTensor]], settings: dict) -> None:
    """The simple way: every rank gathers every sharded matrix (parameter, gradient, momentum), steps it whole and
    keeps its part."""
    for p, g, b in entries:
        full_p, full_g, full_b = p.full_tensor(), g.full_tensor(), b.full_tensor()
        step_whole([full_p], [full_g], [full_b], settings)
        p.to_local().copy_(_own_part(full_p, p))
        b.to_local().copy_(_own_part(full_b, b))


def mesh_group(mesh) -> Any:
    """The process group over all of ``mesh``'s ranks (a flattened mesh for several dimensions; cached by torch)."""
    if mesh.ndim == 1:
        return mesh.get_group()
    names = mesh.mesh_dim_names or tuple(f"d{i}" for i in range(mesh.ndim))
    return mesh._flatten("_".join(names)).get_group()


@dataclass
class _MeshPlan:
    """One mesh's sharded matrices: their owners, and (on each owner) every rank's element positions."""

    group: Any
    ranks: list[int]
    owner: list[int]  # group rank owning each matrix
    sizes: torch.Tensor  # [group size, matrices]: local elements per rank
    positions: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # matrix -> per group rank


def _assign_owners(numels: list[int], n: int) -> list[int]:
    """Largest matrix first, each to the least loaded rank (ties: the lowest); the same on every rank."""
    load, owner = [0] * n, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        r = min(range(n), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + numels[i]
    return owner


class SpreadStep:
    """The spread way: the matrices of one mesh split among its ranks by owner, gathered to their owner and
    scattered back. The plan is made at the first step and kept (the parameters never change)."""

    def __init__(self) -> None:
        self._plans: dict[tuple, _MeshPlan] = {}

    def __call__(self, entries: list[tuple[DTensor, DTensor, DTensor]], settings: dict) -> None:
        by_mesh: dict[Any, list] = {}
        for entry in entries:
            by_mesh.setdefault(entry[0].device_mesh, []).append(entry)
        for mesh, group_entries in by_mesh.items():
            key = (mesh, tuple(id(p) for p, _, _ in group_entries))
            if key not in self._plans:
                self._plans[key] = self._plan(mesh, [p for p, _, _ in group_entries])
            self._step(self._plans[key], group_entries, settings)

    @staticmethod
    def _plan(mesh, params: list[DTensor]) -> _MeshPlan:
        group = mesh_group(mesh)
        ranks = dist.get_process_group_ranks(group)
        n, me = len(ranks), dist.get_rank(group)
        owner = _assign_owners([p.numel() for p in params], n)
        mine = torch.tensor([p.to_local().numel() for p in params], dtype=torch.int64)
        sizes = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(sizes, mine, group=group)
        plan = _MeshPlan(group=group, ranks=ranks, owner=owner, sizes=torch.stack(sizes))
        index = [_own_part(torch.arange(p.numel(), dtype=torch.int64).view(p.shape), p).reshape(-1) for p in params]
        received = _exchange(plan, [[index[i]] for i in range(len(params))], dtype=torch.int64, me=me)
        for i, per_rank in received.items():
            plan.positions[i] = [parts[0] for parts in per_rank]
        return plan

    @staticmethod
    def _step(plan: _MeshPlan, entries: list, settings: dict) -> None:
        me = dist.get_rank(plan.group)
        dtype = entries[0][0].to_local().dtype
        parts = [[_local(t).reshape(-1) for t in entry] for entry in entries]
        received = _exchange(plan, parts, dtype=dtype, me=me)
        back: dict[int, list[list[torch.Tensor]]] = {}
        for i, per_rank in received.items():
            p = entries[i][0]
            full = [torch.empty(p.numel(), dtype=dtype, device=p.to_local().device) for _ in range(3)]
            for r, pieces in enumerate(per_rank):
                for whole, piece in zip(full, pieces):
                    whole[plan.positions[i][r]] = piece
            shaped = [t.view(p.shape) for t in full]
            step_whole([shaped[0]], [shaped[1]], [shaped[2]], settings)
            back[i] = [[full[0][pos], full[2][pos]] for pos in plan.positions[i]]
        device = entries[0][0].to_local().device
        for i, (new_p, new_b) in _scatter_back(plan, back, dtype=dtype, device=device, me=me).items():
            p, _, b = entries[i]
            p.to_local().view(-1).copy_(new_p)
            b.to_local().view(-1).copy_(new_b)


def _exchange(plan: _MeshPlan, parts: list[list[torch.Tensor]], *, dtype, me: int) -> dict:
    """Every rank's ``parts`` of each matrix to that matrix's owner: one gather per owner, all in flight together.
    Returns, on the owner, matrix -> per group rank -> its parts."""
    n, width = len(plan.ranks), len(parts[0]) if parts else 0
    works, inbox = [], {}
    for o in range(n):
        mats = [i for i, w in enumerate(plan.owner) if w == o]
        if not mats:
            continue
        lengths = plan.sizes[:, mats].sum(dim=1) * width  # per rank
        pad = int(lengths.max())
        send = torch.zeros(pad, dtype=dtype, device=parts[mats[0]][0].device)
        flat = torch.cat([t for i in mats for t in parts[i]]) if pad else send[:0]
        send[: flat.numel()] = flat
        gather_list = [torch.empty_like(send) for _ in range(n)] if o == me else None
        works.append(dist.gather(send, gather_list, dst=plan.ranks[o], group=plan.group, async_op=True))
        if o == me:
            inbox = {"mats": mats, "bufs": gather_list}
    for w in works:
        w.wait()
    if not inbox:
        return {}
    out: dict[int, list[list[torch.Tensor]]] = {i: [] for i in inbox["mats"]}
    for r, buf in enumerate(inbox["bufs"]):
        sizes = [int(plan.sizes[r, i]) for i in inbox["mats"] for _ in range(width)]
        pieces = buf[: sum(sizes)].split(sizes)
        k = 0
        for i in inbox["mats"]:
            out[i].append(list(pieces[k : k + width]))
            k += width
    return out


def _scatter_back(plan: _MeshPlan, back: dict, *, dtype, device, me: int) -> dict:
    """Each owner's new parameter and momentum parts to the ranks holding them: one scatter per owner, all in
    flight together. Returns matrix -> (its new parameter part, its new momentum part) on this rank."""
    n = len(plan.ranks)
    works, landing = [], []
    for o in range(n):
        mats = [i for i, w in enumerate(plan.owner) if w == o]
        if not mats:
            continue
        lengths = plan.sizes[:, mats].sum(dim=1) * 2
        pad = int(lengths.max())
        recv = torch.empty(pad, dtype=dtype, device=device)
        scatter_list = None
        if o == me:
            scatter_list = []
            for r in range(n):
                out = torch.zeros(pad, dtype=dtype, device=device)
                flat = torch.cat([t for i in mats for t in back[i][r]]) if pad else out[:0]
                out[: flat.numel()] = flat
                scatter_list.append(out)
        works.append(dist.scatter(recv, scatter_list, src=plan.ranks[o], group=plan.group, async_op=True))
        landing.append((mats, recv))
    for w in works:
        w.wait()
    mine: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for mats, recv in landing:
        k = 0
        for i in mats:
            size = int(plan.sizes[me, i])
            mine[i] = (recv[k : k + size], recv[k + size : k + 2 * size])
            k += 2 * size
    return mine
