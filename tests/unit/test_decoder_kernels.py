"""The decoders' cheap kernels give the textbook numbers: the complex-multiply rotary embedding against the
real-valued pair rotation (which is what runs under ``torch.compile``), and SDPA's ``enable_gqa`` against key/value heads copied ``n_rep`` times (forward and
backward)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models.llama.model import apply_rotary, causal_attention, rotary_table, rotate_pairs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_complex_rotary_equals_the_pair_rotation(dtype):
    torch.manual_seed(0)
    table = rotary_table(16, 32, 10000.0)
    x = torch.randn(2, 32, 3, 16, dtype=dtype, requires_grad=True)
    out = apply_rotary(x, table)
    expected = rotate_pairs(x, table)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    (grad,) = torch.autograd.grad(out.float().pow(2).sum(), x)
    (grad_expected,) = torch.autograd.grad(expected.float().pow(2).sum(), x)
    torch.testing.assert_close(grad, grad_expected, rtol=1e-5, atol=1e-5)


def test_shared_kv_heads_equal_copied_heads_forward_and_backward():
    torch.manual_seed(0)
    q = torch.randn(2, 24, 8, 16, requires_grad=True)
    k = torch.randn(2, 24, 2, 16, requires_grad=True)
    v = torch.randn(2, 24, 2, 16, requires_grad=True)
    out = causal_attention(q, k, v)
    copied = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.repeat_interleave(4, dim=2).transpose(1, 2),
        v.repeat_interleave(4, dim=2).transpose(1, 2),
        is_causal=True,
    ).transpose(1, 2)
    assert out.shape == q.shape
    torch.testing.assert_close(out, copied, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    grads_copied = torch.autograd.grad((copied * weights).sum(), (q, k, v))
    for g, e in zip(grads, grads_copied):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_compiled_rotary_is_real_valued_and_equal():
    """Compiled, the rotation takes the real form: the graphs torch.compile hands its backend, forward and backward
    (AOTAutograd's, which Inductor would lower), hold no complex-valued tensor, so Inductor has no complex operator
    to fall back on (it warns "does not support code generation for complex operators" when it meets one); and
    they give the eager numbers. The graphs are run as they are (no C++ code generated: the property is the
    graphs', and compiling them cost most of the fast tier's time for this one test)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch.manual_seed(0)
    table = rotary_table(16, 32, 10000.0)
    x = torch.randn(2, 32, 3, 16, requires_grad=True)
    compiled = torch.compile(apply_rotary, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    out = compiled(x, table)
    (grad,) = torch.autograd.grad(out.pow(2).sum(), x)
    assert len(graphs) == 2  # forward and backward
    values = [n.meta.get("val") for g in graphs for n in g.graph.nodes]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    assert tensors and not [t for t in tensors if t.is_complex()]
    eager = apply_rotary(x, table)
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)
    (grad_eager,) = torch.autograd.grad(eager.pow(2).sum(), x)
    torch.testing.assert_close(grad, grad_eager, rtol=1e-5, atol=1e-5)
