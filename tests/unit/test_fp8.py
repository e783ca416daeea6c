"""trainer.precision=fp8 (parallel/techniques/fp8.py) in one process: which Linears become torchao's Float8Linear
and which stay, what the emulated float8 matmul does to the numbers, the recipes' torchao configs, where the float8
tensor-parallel styles apply, and the refusals before spawn. The runs (losses against bf16-mixed under single,
fsdp with float8 all-gather, tp with float8 styles, resume) are in tests/integration/test_fp8_runs.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parallel.techniques.fp8 import Float8Settings, convert_to_fp8, float8_config, float8_linears, fp8_eligible
from trainer.validate import ConfigError, validate

ATTENTION = ("attention.wq", "attention.wk", "attention.wv", "attention.wo")
FEED_FORWARD = ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def _llama(d_ff: int = 176) -> nn.Module:
    """Two blocks; d_model 64, kv width 32; d_ff 176 = 11 x 16 (a multiple of 16, not of 32: tp=2 leaves 88)."""
    from models.llama.model import Llama

    torch.manual_seed(0)
    return Llama(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=d_ff, max_seq_len=32)


def _names(*subs: str, blocks=("0", "1")) -> list[str]:
    return [f"layers.{b}.{s}" for b in blocks for s in subs]


def _convert(model: nn.Module, *, tp: int = 1, gather: bool = False, **settings) -> list[str]:
    return convert_to_fp8(
        model,
        settings=Float8Settings(skip=("output", *settings.pop("skip", ())), **settings),
        emulate=True,
        fsdp_float8_all_gather=gather,
        tp=tp,
    )


def test_conversion_takes_the_blocks_projections_not_the_head():
    from torchao.float8.float8_linear import Float8Linear

    model = _llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    converted = _convert(model)
    assert sorted(converted) == sorted(_names(*ATTENTION, *FEED_FORWARD))
    assert sorted(float8_linears(model)) == sorted(converted)
    assert type(model.output) is nn.Linear and not isinstance(model.output, Float8Linear)
    after = model.state_dict()  # the same keys and values: checkpoints and TP plans read the same names
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_dims_not_multiple_of_16_after_tp_sharding_stay_high_precision():
    assert sorted(_convert(_llama(d_ff=168))) == sorted(_names(*ATTENTION))  # 168 = 10.5 x 16
    # tp=2: every rank holds 176 / 2 = 88 of the feed-forward's width, not a multiple of 16; attention's 64 -> 32 is
    assert sorted(_convert(_llama(), tp=2)) == sorted(_names(*ATTENTION))
    assert not fp8_eligible(nn.Linear(64, 88), "x", skip=())
    assert not fp8_eligible(nn.LayerNorm(64), "x", skip=())
    assert not fp8_eligible(type("OwnLinear", (nn.Linear,), {})(64, 64), "x", skip=())  # its own forward stays
    assert fp8_eligible(nn.Linear(64, 96), "layers.0.x", skip=("output",))


def test_skip_patterns_keep_modules_out():
    converted = _convert(_llama(), skip=("layers.1.*", "*.wo"))
    assert sorted(converted) == sorted(
        _names("attention.wq", "attention.wk", "attention.wv", *FEED_FORWARD, blocks="0")
    )
    # a pipeline stage's or wrapper's prefix still matches
    assert not fp8_eligible(nn.Linear(64, 64), "stage.output", skip=("output",))


def test_emulated_float8_quantises_the_matmul():
    """Emulation casts input and weight to e4m3 with dynamic scales and multiplies the dequantised values: the
    output moves by e4m3's rounding (3 mantissa bits, up to 2^-4 of each element; 3.8e-2 of the output's norm here,
    measured, for both recipes), far more than bf16's (8 bits: about 3e-3), and gradients reach the fp32 weights."""
    for recipe in ("tensorwise", "rowwise"):
        torch.manual_seed(0)
        linear = nn.Linear(64, 96, bias=False)
        x = torch.randn(8, 64)
        ref = linear(x)
        model = nn.Sequential(linear)
        _convert(model, recipe=recipe)
        out = model(x)
        rel = ((out - ref).norm() / ref.norm()).item()
        assert 1e-2 < rel < 1e-1, (recipe, rel)
        out.sum().backward()
        assert model[0].weight.grad.dtype == torch.float32 and model[0].weight.grad.abs().sum() > 0


def test_recipes_configs_and_float8_all_gather():
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    tensorwise = float8_config(Float8Settings(), emulate=True, fsdp_float8_all_gather=True)
    assert tensorwise.cast_config_weight.scaling_granularity is ScalingGranularity.TENSORWISE
    assert tensorwise.emulate and tensorwise.enable_fsdp_float8_all_gather
    rowwise = float8_config(Float8Settings(recipe="rowwise"), emulate=False, fsdp_float8_all_gather=False)
    assert rowwise.cast_config_weight.scaling_granularity is ScalingGranularity.AXISWISE
    assert rowwise.round_scales_to_power_of_2 and not rowwise.emulate
    # FSDP2's float8 all-gather: the converted weights carry torchao's all-gather hooks (a meta build keeps them)
    with torch.device("meta"):
        model = _llama()
    _convert(model, gather=True)
    model.to_empty(device="cpu")
    model.init_weights()
    assert isinstance(model.layers["0"].attention.wq.weight.data, WeightWithDynamicFloat8CastTensor)
    assert not isinstance(model.output.weight.data, WeightWithDynamicFloat8CastTensor)
    # on for tensorwise under FSDP2 unless turned off; never without FSDP2; never rowwise
    assert Float8Settings().all_gather_in_float8(fsdp=True)
    assert not Float8Settings().all_gather_in_float8(fsdp=False)
    assert not Float8Settings(fsdp_float8_all_gather=False).all_gather_in_float8(fsdp=True)
    assert not Float8Settings(recipe="rowwise").all_gather_in_float8(fsdp=True)
    with pytest.raises(ValueError, match="tensorwise scales only"):
        Float8Settings(recipe="rowwise", fsdp_float8_all_gather=True)


def test_float8_tp_styles_apply_to_all_float8_sub_blocks_only():
    """torchao's float8 styles cast a sub-block's input to float8 once for all its projections: a sub-block with a
    Linear left in high precision keeps torch's styles."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    from models.llama.spec import SPEC
    from models.tensor_parallel import block_plan
    from parallel.techniques.fp8 import float8_tp_styles

    model = _llama(d_ff=168)  # the feed-forward stays high precision
    _convert(model)
    styles = float8_tp_styles(sequence_parallel=False, device_type="cpu")
    plan = block_plan(SPEC.tp_plan, "layers.0", sequence_parallel=False, model=model, styles=styles)
    assert type(plan["layers.0.attention.wq"]) is Float8ColwiseParallel
    assert type(plan["layers.0.attention.wo"]) is Float8RowwiseParallel
    assert type(plan["layers.0.feed_forward.w1"]) is ColwiseParallel
    assert type(plan["layers.0.feed_forward.w2"]) is RowwiseParallel
    # gloo has no float8 dtypes: with sequence parallel the float8 all-gather of the sequence cannot run there
    assert float8_tp_styles(sequence_parallel=True, device_type="cpu") is None
    assert float8_tp_styles(sequence_parallel=True, device_type="cuda") is not None


# ---- refused before spawn -------------------------------------------------------------------------


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


def test_fp8_combinations_torchao_lacks_refused(compose_cfg):
    msg = _problems(
        compose_cfg(
            "parallel=fsdp",
            "trainer.precision=fp8",
            "trainer.fp8.recipe=rowwise",
            "trainer.fp8.fsdp_float8_all_gather=true",
        )
    )
    assert "trainer.fp8.fsdp_float8_all_gather=true with trainer.fp8.recipe=rowwise" in msg
    assert "use trainer.fp8.recipe=tensorwise" in msg
    msg = _problems(compose_cfg("parallel=ddp", "trainer.precision=fp8", "trainer.fp8.fsdp_float8_all_gather=true"))
    assert "trainer.fp8.fsdp_float8_all_gather=true with parallel=ddp" in msg and "use parallel=fsdp" in msg
    msg = _problems(compose_cfg("trainer.precision=fp8", "model.lora.rank=8"))
    assert "trainer.precision=fp8 with model.lora.rank=8" in msg and "use trainer.precision=bf16-mixed" in msg


def test_fp8_on_a_gpu_without_float8_refused(compose_cfg, monkeypatch):
    import trainer.checks.compute as compute

    monkeypatch.setattr(compute, "cuda_compute_capabilities", lambda: [8.0])
    msg = _problems(compose_cfg("trainer.precision=fp8", "topology.device=cuda"))
    assert "trainer.precision=fp8 on a GPU of compute capability 8.0" in msg
    assert "8.9 or newer" in msg and "use trainer.precision=bf16-mixed" in msg


def test_fp8_without_torchao_refused(compose_cfg, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    msg = _problems(compose_cfg("trainer.precision=fp8", "topology.device=cpu"))
    assert "torchao is not installed" in msg and "pip install" in msg


def test_fsdp_all_gathers_float8_buffers_as_bytes(gloo_one_rank):
    """FSDP2 gathers a unit whose all-gather inputs are all float8 in a float8 buffer; gloo refuses float8 dtypes,
    so meshtrain's all-gather (timed or not) passes the same bytes as uint8."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    from parallel.techniques.fsdp import FSDPCommTimer, _BytesAllGather, _TimedAllGather

    group = dist.group.WORLD
    shard = torch.randn(8).to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="Invalid scalar type"):
        DefaultAllGather()(torch.empty(8, dtype=torch.float8_e4m3fn), shard, group)
    for gather in (_BytesAllGather(), _TimedAllGather(FSDPCommTimer())):
        out = torch.empty(8, dtype=torch.float8_e4m3fn)
        gather(out, shard, group)
        assert torch.equal(out.view(torch.uint8), shard.view(torch.uint8))


def test_parallel_auto_keeps_fp8(compose_cfg):
    """The planner plans fp8 as mixed precision (its state bytes are bf16-mixed's) and writes the layout it chose
    back without turning fp8 into bf16-mixed; fp32 runs still take the plan's precision."""
    from parallel.plan.cli import CONF
    from parallel.plan.cost_model import Candidate
    from parallel.plan.search import available_strategies
    from trainer.launch.auto import apply_candidate

    for asked, planned, trains in (("fp8", "mixed", "fp8"), ("fp32", "mixed", "bf16-mixed")):
        cfg = compose_cfg("parallel=auto", "data.global_batch_size=16", f"trainer.precision={asked}")
        apply_candidate(cfg, Candidate(dp=2, micro_batches=4), strategies=available_strategies(CONF), precision=planned)
        assert cfg.trainer.precision == trains and cfg.parallel.name == "ddp"


def test_float8_tp_styles_gather_the_sequence_in_float8_under_a_fake_group():
    """The CUDA path gloo cannot run (sequence parallel with torchao's styles: the sequence all-gathers carry float8),
    under torch's fake process group: forward and backward run through the family's plan, and the all-gathers that
    feed the block projections take torchao's Float8TrainingTensor where torch's styles gather fp32."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from models.llama.spec import SPEC
    from models.losses import token_cross_entropy
    from parallel.techniques.fp8 import float8_tp_styles

    parallelize_llama = SPEC.parallelize_fn()  # the decoders' one parallelize function over Llama's plan

    class Gathers(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.inputs: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "all_gather_into_tensor" in str(func):
                self.inputs.append(str(args[0].dtype) if type(args[0]) is torch.Tensor else type(args[0]).__name__)
            return func(*args, **(kwargs or {}))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        gathered = {}
        for name, styles in (("torch", None), ("float8", float8_tp_styles(sequence_parallel=True, device_type="cuda"))):
            model = _llama(d_ff=192)
            _convert(model, tp=2)
            parallelize_llama(model, tp_mesh=mesh, sequence_parallel=True, styles=styles)
            x = torch.randint(0, 256, (2, 33))
            with Gathers() as mode:
                token_cross_entropy(model(x[:, :-1]), x[:, 1:]).backward()
            gathered[name] = mode.inputs
    finally:
        dist.destroy_process_group()
    assert set(gathered["torch"]) == {"torch.float32"}
    # 2 blocks x 2 sub-blocks: each input gathered once in forward, each output's gradient in backward, in float8;
    # the head's input (and its gradient) stays fp32
    assert gathered["float8"].count("Float8TrainingTensor") == 8 and "torch.float32" in gathered["float8"]
    assert len(gathered["float8"]) == len(gathered["torch"])
