"""Each rank reads exactly its own shard from a Hugging Face folder: under torch's fake process group, one process
plays every rank of a dp x tp mesh (tensor parallel, then FSDP2 over it, as the strategies apply them) and of an
uneven FSDP2 layout of a tied GPT-2, builds the model on the meta device, materialises its shards without
initialising them and loads. Every local shard equals the slice of the whole meshtrain tensor that sharding rule
gives it (tp chunks first, then FSDP2's dim-0 chunks), the tie survives, and a rank reads only its share."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from models.registry import REGISTRY
from tests.hf_helpers import hf_model, meshtrain_twin, save_folder


def expected_shard(full: torch.Tensor, tensor: DTensor, coords: dict[str, int], sizes: dict[str, int]) -> torch.Tensor:
    """The rank's part by the strategies' rule: the tp placement's chunk, then FSDP2's chunk along dim 0."""
    names = tensor.device_mesh.mesh_dim_names
    part = full
    for name, placement in zip(names, tensor.placements):
        if name == "tp" and isinstance(placement, Shard):
            part = part.chunk(sizes["tp"], dim=placement.dim)[coords["tp"]]
    if "dp" in names and not tensor.placements[names.index("dp")].is_replicate():
        part = part.chunk(sizes["dp"], dim=0)[coords["dp"]]
    return part


def load_every_rank(family: str, hf, folder, *, sizes: dict[str, int]):
    """For each rank: (coords, its module after loading)."""
    from hydra.utils import instantiate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from models.spec import builder_kwargs
    from parallel.plan.dry_run import _clear_dtensor_caches
    from trainer.hf.load import load_hf_weights

    _, model_cfg = meshtrain_twin(family, hf)
    world = sizes["dp"] * sizes.get("tp", 1)
    names = tuple(sizes)
    for rank in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        try:
            mesh = init_device_mesh("cpu", tuple(sizes.values()), mesh_dim_names=names)
            with torch.device("meta"):
                module = instantiate(builder_kwargs(model_cfg))
            if sizes.get("tp", 1) > 1:
                REGISTRY[family].parallelize_fn()(module, tp_mesh=mesh["tp"])
            for block in module.layers.values():
                fully_shard(block, mesh=mesh["dp"])
            fully_shard(module, mesh=mesh["dp"])
            module.to_empty(device="cpu")
            if hasattr(module, "init_buffers"):
                module.init_buffers()
            info = load_hf_weights(module, folder=folder, model_cfg=model_cfg)
            coords = {n: int(c) for n, c in zip(names, mesh.get_coordinate())}
            yield coords, module, model_cfg, info
        finally:
            dist.destroy_process_group()
            _clear_dtensor_caches()  # else the next rank's 2-D shards reuse this rank's mesh (and offsets)


@pytest.mark.parametrize(
    "family, options, sizes",
    [
        ("llama", {"num_key_value_heads": 2}, {"dp": 2, "tp": 2}),
        ("qwen3", {"num_key_value_heads": 2, "head_dim": 32}, {"dp": 2, "tp": 2}),
        ("gpt", {}, {"dp": 3}),  # tied head, fused and transposed q/k/v, uneven rows (64 / 3)
    ],
)
def test_every_rank_holds_exactly_its_slice(tmp_path, family, options, sizes):
    hf = hf_model(family, vocab_size=256, **options)
    folder = save_folder(hf, tmp_path / family)
    whole, _ = meshtrain_twin(family, hf)
    full = whole.state_dict()
    total = sum(t.numel() * t.element_size() for k, t in full.items() if not (family == "gpt" and k == "output.weight"))
    for coords, module, _, info in load_every_rank(family, hf, folder, sizes=sizes):
        for fqn, tensor in module.state_dict().items():
            want = expected_shard(full[fqn], tensor, coords, sizes) if isinstance(tensor, DTensor) else full[fqn]
            got = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            assert torch.equal(got, want), (coords, fqn)
        if family == "gpt":
            assert module.output.weight is module.tok_embeddings.weight
        assert 0 < info["bytes_read"] < total, (coords, info["bytes_read"], total)
