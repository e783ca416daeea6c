"""Context parallel (parallel/techniques/cp.py) without processes: cp "ranks" are threads of this process whose
all-to-all is an exchange through a barrier (an autograd function: its backward is the reverse exchange, as
``all_to_all_single_autograd``'s). Each thread runs the whole model on its contiguous chunk of the sequence; the
chunks' logits and the summed gradients must be the single-process model's (fp32). The real collective runs in the
train.py parity tests (tests/integration/test_cp_parity.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from parallel.techniques import cp as cp_mod


class _Exchange:
    """An all-to-all among ``n`` threads: thread r's slab j goes to thread j, in forward and backward."""

    def __init__(self, n: int):
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots: dict[tuple[int, int], torch.Tensor] = {}
        self.local = threading.local()

    def swap(self, x: torch.Tensor) -> torch.Tensor:
        me = self.local.rank
        for j in range(self.n):
            self.slots[(me, j)] = x[j].detach().clone()
        self.barrier.wait()
        out = torch.stack([self.slots[(i, me)] for i in range(self.n)])
        self.barrier.wait()
        return out

    def function(self):
        exchange = self

        class AllToAll(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return exchange.swap(x)

            @staticmethod
            def backward(ctx, grad):
                return exchange.swap(grad.contiguous())

        return AllToAll.apply


def _run_chunks(build, tokens: torch.Tensor, *, cp: int, monkeypatch, seq_chunks: bool = True):
    """Each of ``cp`` threads: a copy of the model with ``attend`` wrapped by ``ulysses`` and its ``seq_chunk``,
    forward on its chunk, backward of the sum of its logits x a fixed weight. Returns (logits, grads) per chunk."""
    exchange = _Exchange(cp)
    apply = exchange.function()
    monkeypatch.setattr(cp_mod, "_exchange", lambda x, group, timer=None: apply(x.contiguous()))
    results: list = [None] * cp
    errors: list = []
    models = [build() for _ in range(cp)]  # here: the seeded build draws from the process-wide generator

    def rank(r: int) -> None:
        try:
            exchange.local.rank = r
            model = models[r]
            for sub in model.modules():
                if callable(getattr(sub, "attend", None)):
                    sub.attend = cp_mod.ulysses(sub.attend, group=None, cp=cp)
            model.seq_chunk = r if seq_chunks else 0
            chunk = cp_mod.local_chunk(tokens, cp=cp, index=r)
            out = model(chunk)
            t = out.shape[1]
            full_weight = torch.linspace(-1, 1, out.numel() * cp).view(out.shape[0], cp * t, -1)
            (out * full_weight[:, r * t : (r + 1) * t]).sum().backward()
            results[r] = (out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            exchange.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(cp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def _reference(build, tokens):
    model = build()
    out = model(tokens)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _llama(**kw):
    from models.llama.model import Llama

    def build():
        torch.manual_seed(0)
        return Llama(vocab_size=64, n_layers=2, d_model=32, n_heads=4, max_seq_len=32, **kw)

    return build


def _qwen3():
    from models.qwen3.model import Qwen3

    def build():
        torch.manual_seed(0)
        return Qwen3(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, head_dim=16, max_seq_len=32)

    return build


def _gpt():
    from models.gpt.model import GPT

    def build():
        torch.manual_seed(0)
        return GPT(vocab_size=64, n_layers=2, d_model=32, n_heads=4, max_seq_len=32)

    return build


@pytest.mark.parametrize(
    ("family", "cp"),
    [("llama", 2), ("llama_gqa1", 4), ("llama_gqa2", 4), ("qwen3", 2), ("gpt", 2), ("gpt", 4)],
)
def test_chunks_with_all_to_all_equal_the_whole_sequence(family, cp, monkeypatch):
    """Logits of each chunk = that slice of the full model's; gradients summed over the chunks = the full model's
    (parameters are replicated across cp, so their gradients add up, as the dp x cp reduction does). GQA with
    1 or 2 key/value heads over cp=4 repeats them (``kv_repeats``)."""
    build = {
        "llama": _llama(),
        "llama_gqa1": _llama(n_kv_heads=1),
        "llama_gqa2": _llama(n_kv_heads=2),
        "qwen3": _qwen3(),
        "gpt": _gpt(),
    }[family]
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    ref_out, ref_grads = _reference(build, tokens)
    results = _run_chunks(build, tokens, cp=cp, monkeypatch=monkeypatch)
    out = torch.cat([r[0] for r in results], dim=1)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-6)
    for name, grad in ref_grads.items():
        summed = sum(r[1][name] for r in results)
        torch.testing.assert_close(summed, grad, rtol=1e-5, atol=2e-6, msg=name)


def test_kv_heads_are_repeated_to_whole_heads_per_rank():
    assert [cp_mod.kv_repeats(kv, 4) for kv in (1, 2, 4, 8)] == [4, 2, 1, 1]
    assert cp_mod.kv_repeats(3, 2) == 2  # lcm(3, 2) = 6 heads: 3 per rank


@pytest.mark.parametrize("family", ["llama", "gpt"])
def test_positions_must_follow_the_chunk(family, monkeypatch):
    """The control: chunks that keep positions 0..t-1 (``seq_chunk`` left at 0) do not give the full model's
    logits, rotary (relative: queries of chunk 1 meet keys of chunk 0) and learned positions alike."""
    build = {"llama": _llama(), "gpt": _gpt()}[family]
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    ref_out, _ = _reference(build, tokens)
    results = _run_chunks(build, tokens, cp=2, monkeypatch=monkeypatch, seq_chunks=False)
    out = torch.cat([r[0] for r in results], dim=1)
    torch.testing.assert_close(out[:, :8], ref_out[:, :8], rtol=0, atol=2e-6)  # chunk 0 is at its place anyway
    assert (
        out[:, 8:] - ref_out[:, 8:]
    ).abs().max() > 2e-5  # 10x the tolerance above (attention is near uniform at init)


# ---- before any process: validation, the planner, the dry run ---------------------------------------------


def _hybrid_cp(*overrides: str) -> tuple[str, ...]:
    model = () if any(o.startswith("model=") for o in overrides) else ("model=llama_debug",)
    return ("parallel=hybrid", "dp.size=1", "tp.size=1", "pp.size=1", *model, *overrides)


def test_validation_refuses_what_does_not_split_with_the_fix(compose_cfg):
    from trainer.validate import ConfigError, validate

    ok = validate(compose_cfg(*_hybrid_cp("cp.size=2")), environ={})
    assert ok.layout.cp == 2 and ok.layout.world_size == 2 and ok.layout.dp_shard  # FSDP2 over the cp ranks
    cases = {
        ("cp.size=8",): "model.n_heads=4 not divisible by cp.size=8: context parallel (ulysses) gives each cp rank "
        "whole attention heads over the full sequence; use cp.size in [1, 2, 4]",
        ("cp.size=4", "tp.size=2"): "model.n_heads=4 / tp.size=2 = 2 heads per tp rank not divisible by cp.size=4",
        ("cp.size=4", "data.seq_len=30"): "data.seq_len=30 is not divisible by cp.size=4: each rank holds an equal "
        "contiguous chunk of every sample; use data.seq_len=28 or 32",
        ("cp.size=2", "tp.size=2", "tp.sequence_parallel=true", "data.seq_len=30"): "data.seq_len=30 is not divisible "
        "by cp.size=2 x tp.size=2 (tp.sequence_parallel=true)",
        ("cp.size=2", "model=cnn_bn", "data=images"): "the model family 'cnn' has no context-parallel attention",
        ("cp.size=2", "cp.attention=ring"): "ring",
        ("cp.size=2", "data.packing=documents"): "data.packing=documents with cp.size=2: the documents' attention",
    }
    for extra, message in cases.items():
        with pytest.raises(Exception) as err:
            validate(compose_cfg(*_hybrid_cp(*extra)), environ={})
        assert message in str(err.value), (extra, str(err.value))
    with pytest.raises(ConfigError, match="cp.size=2 with parallel=ddp: ddp does not use the cp dimension"):
        validate(compose_cfg("parallel=ddp", "cp.size=2", "topology.nproc_per_node=4"), environ={})


def test_cost_model_splits_tokens_and_counts_the_all_to_alls(compose_cfg):
    """Per rank at cp=2: half the saved activations but for the output all-to-all's copy that wo saves (q_dim values
    a token per block) and the whole rotary table, the compute of dp=2 on the same 2 ranks (half the tokens each,
    the attention's s² term over the whole sequence: FLOPs per token at the full length), and 8 all-to-alls per
    block of b·s/c·h/t elements each."""
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.cost_model import Candidate, all_to_all_s, estimate, rotary_table_saved_bytes

    cfg = compose_cfg("model=llama_debug", "data.seq_len=1024", "data.global_batch_size=2", "planner.precision=fp32")
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    one, two, dp2 = (
        estimate(c, model=model, hardware=hardware, workload=workload)
        for c in (Candidate(), Candidate(cp=2), Candidate(dp=2))
    )
    table = rotary_table_saved_bytes(model, seq_len=1024)
    copies = 2 * 512 * model.n_layers * model.q_dim * 4  # b=2 samples x 512 tokens, fp32
    halved = one.rank_activation_per_micro_batch[0] / 2
    assert two.rank_activation_per_micro_batch[0] == pytest.approx(halved + table / 2 + copies)
    assert two.compute_s == pytest.approx(dp2.compute_s) and two.compute_s < 0.6 * one.compute_s
    assert one.cp_comm_s == 0 and two.cp_comm_s > 0
    link = hardware.link_for(span=2, stride=1)
    per_a2a = all_to_all_s(2 * 512 * model.q_dim * 4, n=2, link=link)  # b=2 samples x 512 tokens x q_dim, fp32
    assert two.cp_comm_s == pytest.approx(8 * model.n_layers * per_a2a)
    assert two.to_dict()["breakdown_s"]["cp_comm"] == two.cp_comm_s


def test_dry_run_builds_cp_and_halves_the_activations(compose_cfg):
    """The dry run composes cp (the all-to-alls under the fake process group, seq_len / cp per rank): one rank's
    saved activations at cp=2 are about half of cp=1's at the same batch (the all-to-all's own buffers on top)."""
    from parallel.plan.cost_model import Candidate
    from parallel.plan.dry_run import dry_run
    from tests.planning import planner_inputs

    cfg = compose_cfg("model=llama_debug", "data.seq_len=512", "data.global_batch_size=1", "planner.precision=fp32")
    model_config, (model, hardware, workload) = planner_inputs(cfg)
    acts = {}
    for cp in (1, 2):
        report = dry_run(
            model_config=model_config,
            candidate=Candidate(cp=cp),
            model=model,
            hardware=hardware,
            workload=workload,
        )
        assert all(r.error is None for r in report.ranks), [r.error for r in report.ranks]
        acts[cp] = max(r.measured["activations_per_micro_batch"] for r in report.ranks)
    print("dry-run activations per rank, cp=1 / cp=2 (MB):", acts[1] / 1e6, acts[2] / 1e6)
    assert acts[2] <= 0.55 * acts[1]
