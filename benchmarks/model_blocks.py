"""Forward + backward of one block of each decoder family: meshtrain's against a plain reference block.

The reference blocks are written here the way the published reference code writes them: Llama as Meta's and
torchtitan's (``nn.RMSNorm``, a complex ``freqs_cis`` table and one complex multiply for the rotary embedding,
grouped-query attention through SDPA's ``enable_gqa``, SwiGLU), Qwen3 the same plus RMSNorm of each query and key
head before the rotation, GPT as GPT-2 / nanoGPT (LayerNorm, one fused ``c_attn`` projection for q, k, v, tanh
GELU... here exact GELU, as gpt_small). Each reference block is loaded with the meshtrain block's weights and its
output and gradients are compared first (they must agree to float rounding), then the two are timed in rounds:
each round times ``--iters`` forward + backward passes of one side, then the other (the order alternates by
round), so both see the same machine; the ratio per round is reference time / meshtrain time (>= 1.0: meshtrain
as fast or faster). Prints the per-family median and range of the ratios and the load average before and after.

    python benchmarks/model_blocks.py                      # llama, qwen3, gpt; 15 rounds of 5 iterations
    python benchmarks/model_blocks.py --family llama --rounds 11 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.gpt.model import Block as GPTBlock  # noqa: E402
from models.llama.model import Block as LlamaBlock  # noqa: E402
from models.llama.model import rotary_table  # noqa: E402

# torchtitan's llama3 "debugmodel" width (d 256, 16 heads, ffn 768) with Llama 3's 4:1 grouped-query ratio
SHAPES = {
    "llama": {"d_model": 256, "n_heads": 16, "n_kv_heads": 4, "head_dim": 16, "d_ff": 768, "qk_norm": False},
    "qwen3": {"d_model": 256, "n_heads": 8, "n_kv_heads": 4, "head_dim": 64, "d_ff": 768, "qk_norm": True},
    "gpt": {"d_model": 256, "n_heads": 8, "d_ff": 1024},
}


# ---- the reference blocks ---------------------------------------------------------------------------------


def reference_freqs_cis(head_dim: int, seq: int, theta: float) -> torch.Tensor:
    """Meta's ``precompute_freqs_cis``: complex exponentials of position x frequency."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return torch.polar(torch.ones(seq, head_dim // 2), torch.outer(torch.arange(seq).float(), freqs))


def reference_rotary(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Meta's ``apply_rotary_emb``."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk)


class ReferenceDecoderBlock(nn.Module):
    """Llama 3 (torchtitan's TransformerBlock) or, with ``qk_norm``, Qwen3's."""

    def __init__(self, d_model, n_heads, n_kv_heads, head_dim, d_ff, qk_norm, eps=1e-5):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.wq = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, d_model, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim, eps=eps) if qk_norm else None
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.attention_norm = nn.RMSNorm(d_model, eps=eps)
        self.ffn_norm = nn.RMSNorm(d_model, eps=eps)

    def attention(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            xq, xk = self.q_norm(xq), self.k_norm(xk)
        xq, xk = reference_rotary(xq, xk, freqs_cis)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        f = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(f)) * self.w3(f))


class ReferenceGPTBlock(nn.Module):
    """GPT-2 as nanoGPT writes it: one fused q/k/v projection (``c_attn``), ``c_proj``, an MLP ``c_fc``/``c_proj``."""

    def __init__(self, d_model, n_heads, d_ff, eps=1e-5):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1 = nn.LayerNorm(d_model, eps=eps, bias=False)
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=False)
        self.attn_proj = nn.Linear(d_model, d_model, bias=False)
        self.ln_2 = nn.LayerNorm(d_model, eps=eps, bias=False)
        self.c_fc = nn.Linear(d_model, d_ff, bias=False)
        self.mlp_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


# ---- the pairs: same weights, same input -------------------------------------------------------------------


def build_pair(family: str, *, seq: int):
    """(meshtrain block, its extra forward args, reference block, its extra args), the reference holding the
    meshtrain block's weights."""
    torch.manual_seed(0)
    s = SHAPES[family]
    if family == "gpt":
        mesh = GPTBlock(s["d_model"], s["n_heads"], s["d_ff"], 0.0, bias=False, activation="gelu", norm_eps=1e-5)
        ref = ReferenceGPTBlock(s["d_model"], s["n_heads"], s["d_ff"])
        a, f = mesh.attention, mesh.feed_forward
        with torch.no_grad():
            ref.c_attn.weight.copy_(torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]))
            ref.attn_proj.weight.copy_(a.wo.weight)
            ref.c_fc.weight.copy_(f.w1.weight)
            ref.mlp_proj.weight.copy_(f.w2.weight)
        # LayerNorm weights are ones and (meshtrain's) biases zeros on both sides
        return mesh, (), ref, ()
    theta = 10000.0
    mesh = LlamaBlock(
        s["d_model"], s["n_heads"], s["n_kv_heads"], s["d_ff"], 1e-5, head_dim=s["head_dim"], qk_norm=s["qk_norm"]
    )
    for p in mesh.parameters():  # norms are ones: give them values so a mix-up of weights would show
        if p.dim() == 1:
            nn.init.normal_(p, 1.0, 0.1)
    ref = ReferenceDecoderBlock(
        s["d_model"], s["n_heads"], s["n_kv_heads"], s["head_dim"], s["d_ff"], s["qk_norm"], eps=1e-5
    )
    names = {
        "wq": "attention.wq",
        "wk": "attention.wk",
        "wv": "attention.wv",
        "wo": "attention.wo",
        "q_norm": "attention.q_norm",
        "k_norm": "attention.k_norm",
        "w1": "feed_forward.w1",
        "w2": "feed_forward.w2",
        "w3": "feed_forward.w3",
        "attention_norm": "attention_norm",
        "ffn_norm": "ffn_norm",
    }
    mesh_params = dict(mesh.named_parameters())
    with torch.no_grad():
        for name, p in ref.named_parameters():
            module, leaf = name.rsplit(".", 1)
            p.copy_(mesh_params[f"{names[module]}.{leaf}"])
    return mesh, (rotary_table(s["head_dim"], seq, theta),), ref, (reference_freqs_cis(s["head_dim"], seq, theta),)


def fwd_bwd(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    block.zero_grad(set_to_none=True)
    x.grad = None
    out = block(x, *extra)
    out.backward(torch.ones_like(out))
    return out


def check_same(family: str, pair, x: torch.Tensor) -> float:
    mesh, mesh_extra, ref, ref_extra = pair
    a, b = fwd_bwd(mesh, x, mesh_extra), None
    grad_a = x.grad.clone()
    b = fwd_bwd(ref, x, ref_extra)
    diff = max(float((a - b).detach().abs().max()), float((grad_a - x.grad).abs().max()))
    if diff > 1e-4:
        raise SystemExit(f"{family}: meshtrain and reference blocks differ by {diff:.2e} (output or input gradient)")
    return diff


def timed(block: nn.Module, x: torch.Tensor, extra: tuple, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fwd_bwd(block, x, extra)
    return (time.perf_counter() - start) / iters


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=[*SHAPES, "all"], default="all")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=5, help="forward + backward passes per side per round")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    families = list(SHAPES) if args.family == "all" else [args.family]
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch} x seq {args.seq}, fp32, "
        f"{args.rounds} rounds x {args.iters} forward+backward per side; load average before: {loadavg()}"
    )
    rows = []
    for family in families:
        pair = build_pair(family, seq=args.seq)
        mesh, mesh_extra, ref, ref_extra = pair
        x = torch.randn(args.batch, args.seq, SHAPES[family]["d_model"], requires_grad=True)
        diff = check_same(family, pair, x)
        timed(mesh, x, mesh_extra, 3), timed(ref, x, ref_extra, 3)  # warm-up
        ratios, mesh_ms, ref_ms = [], [], []
        for r in range(args.rounds):
            order = ("mesh", "ref") if r % 2 == 0 else ("ref", "mesh")
            got = {}
            for side in order:
                block, extra = (mesh, mesh_extra) if side == "mesh" else (ref, ref_extra)
                got[side] = timed(block, x, extra, args.iters)
            ratios.append(got["ref"] / got["mesh"])
            mesh_ms.append(got["mesh"] * 1e3)
            ref_ms.append(got["ref"] * 1e3)
        rows.append((family, diff, mesh_ms, ref_ms, ratios))
        print(f"{family}: ratios {' '.join(f'{v:.3f}' for v in ratios)} (load {loadavg()})", flush=True)
    print(f"load average after: {loadavg()}\n")
    print("| family | max difference (output, input grad) | meshtrain ms | reference ms | reference / meshtrain |")
    print("|---|---:|---:|---:|---:|")
    for family, diff, mesh_ms, ref_ms, ratios in rows:
        print(
            f"| {family} | {diff:.1e} | {statistics.median(mesh_ms):.2f} | {statistics.median(ref_ms):.2f} "
            f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
