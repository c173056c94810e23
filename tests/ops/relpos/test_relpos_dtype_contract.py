"""The dtype contract of relpos_attention that holds on every device: lse in the
accumulation type (float32, or float64), sigma in q's dtype or float32 with
half inputs; checked here on the meta (fake) kernels and the CPU."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs

from posattn import ops, reference


@pytest.mark.parametrize(
    "dtype,lse",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_lse_is_in_the_accumulation_type(dtype, lse):
    x = make_relpos_inputs([3, 4], sigma=True, dtype=dtype, device="meta")
    out, got = ops.relpos_attention(**x, grid=[3, 4], return_lse=True)
    assert out.dtype == dtype and got.dtype == lse == ops.lse_dtype(dtype)
    if dtype in (torch.float32, torch.float64):  # the CPU kernels agree
        xc = make_relpos_inputs([3, 4], sigma=True, dtype=dtype)
        assert ops.relpos_attention(**xc, grid=[3, 4], return_lse=True)[1].dtype == lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sigma_may_be_float32_with_half_inputs(dtype):
    x = make_relpos_inputs([3, 4], sigma=True, dtype=dtype, device="meta")
    x["sigma"] = x["sigma"].float()
    out, lse = torch.ops.posattn.relpos_attention(
        x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [3, 4], x["sigma"], 0.2, "add", 0.5, False
    )
    grads = torch.ops.posattn.relpos_attention_backward(
        out, lse, x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [3, 4], x["sigma"], 0.2, "add", 0.5, False, out, lse
    )
    assert grads[5].dtype == torch.float32 and grads[0].dtype == dtype


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_other_sigma_dtypes_are_refused(device):
    x = make_relpos_inputs([3, 4], sigma=True, dtype=torch.float32, device=device)
    with pytest.raises(TypeError, match=r"sigma has dtype .*but q has dtype .*or float32 when q is float16"):
        ops.relpos_attention(**{**x, "sigma": x["sigma"].double()}, grid=[3, 4])
    xh = make_relpos_inputs([3, 4], sigma=True, dtype=torch.float16, device="meta")
    with pytest.raises(TypeError, match="sigma has dtype"):
        ops.relpos_attention(**{**xh, "sigma": xh["sigma"].double()}, grid=[3, 4])
    with pytest.raises(TypeError, match="k has dtype .* all tensor arguments must share one dtype"):
        ops.relpos_attention(**{**xh, "k": xh["k"].float()}, grid=[3, 4])


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_backward_refuses_an_lse_of_another_dtype(device):
    x = make_relpos_inputs([3, 4], dtype=torch.float64, device=device)
    out, lse = torch.ops.posattn.relpos_attention(
        x["q"], x["k"], x["v"], x["q_pos"], x["rel"], [3, 4], None, 0.0, "add", 0.5, False
    )
    with pytest.raises(TypeError, match="lse has dtype .*float32|lse has dtype .*Float"):
        torch.ops.posattn.relpos_attention_backward(
            out,
            None,
            x["q"],
            x["k"],
            x["v"],
            x["q_pos"],
            x["rel"],
            [3, 4],
            None,
            0.0,
            "add",
            0.5,
            False,
            out,
            lse.float(),
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_takes_float32_sigma_with_half_inputs(dtype):
    # what the modules pass with half inputs; the reference (CPU fallback) must take it too
    x = make_relpos_inputs([4, 5], sigma=True, dtype=dtype, requires_grad=True)
    x["sigma"] = x["sigma"].detach().float().requires_grad_()
    out, lse = reference.relpos_attention(**x, grid=[4, 5], threshold=0.2, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    grads = torch.autograd.grad(out.float().sum(), list(x.values()))
    assert grads[-1].dtype == torch.float32 and all(torch.isfinite(g).all() for g in grads)
    want = reference.relpos_attention(**{k: t.double() for k, t in x.items()}, grid=[4, 5], threshold=0.2)
    assert (out.double() - want).abs().max() < 0.05


def test_positional_attention_with_half_inputs_on_the_cpu():
    from posattn.nn import DifferentiableSpan, PositionalSelfAttention

    attn = PositionalSelfAttention(16, 2, span=DifferentiableSpan(2, 2, threshold=0.1)).to(torch.bfloat16)
    x = torch.randn(2, 20, 16, dtype=torch.bfloat16)
    attn(x, [4, 5]).float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)
