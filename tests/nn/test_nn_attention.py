"""PositionalSelfAttention and DifferentiableSpan."""

import math

import pytest
import torch
from helpers.nn import LargestTensor

from posattn.grid import relative_offsets
from posattn.nn import DifferentiableSpan, LookupRelativeEncoder, PositionalSelfAttention, SirenRelativeEncoder
from posattn.nn.attention import split_heads


def make_attention(ndim, dim=12, heads=3, span=None, backend="auto", dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    enc = SirenRelativeEncoder(dim, heads, ndim, hidden_dim=16)
    attn = PositionalSelfAttention(dim, heads, encoder=enc, span=span, backend=backend)
    return attn.to(dtype)


@pytest.mark.parametrize("grid", [[6], [3, 4], [2, 1, 3]])
def test_logits_are_transformer_xl_terms(grid):
    attn = make_attention(len(grid))
    N = math.prod(grid)
    x = torch.randn(2, N, 12, dtype=torch.float64)
    logits = attn.logits(x, grid)
    q, k, _ = (split_heads(t, 3) for t in attn.qkv(x).chunk(3, dim=-1))
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(N, -1)
    offsets = relative_offsets(grid)
    table = attn.encoder(grid)
    for b, h, i, j in [(0, 0, 0, N - 1), (1, 2, N - 1, 0), (0, 1, N // 2, 1), (1, 0, 2, 2)]:
        delta = coords[j] - coords[i]
        u = ((offsets == delta).all(-1)).nonzero().item()
        r = table[h, u]
        expected = ((q[b, h, i] + attn.u_bias[h]) @ k[b, h, j] + (q[b, h, i] + attn.v_bias[h]) @ r) / math.sqrt(4)
        torch.testing.assert_close(logits[b, h, i, j], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grid", [[7], [3, 4], [3, 1, 2]])
@pytest.mark.parametrize("span_kw", [None, dict(mode="add"), dict(mode="multiply", threshold=0.2, per_head=True)])
@pytest.mark.parametrize("has_cls", [False, True])
def test_fused_matches_reference_backend(grid, span_kw, has_cls):
    span = DifferentiableSpan(len(grid), 3, init=0.4, **span_kw) if span_kw else None
    fused = make_attention(len(grid), span=span, backend="fused")
    ref = make_attention(len(grid), span=span, backend="reference")
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(2, math.prod(grid) + has_cls, 12, dtype=torch.float64, requires_grad=True)
    y_fused, y_ref = fused(x, grid, has_cls), ref(x, grid, has_cls)
    torch.testing.assert_close(y_fused, y_ref, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(y_fused)
    grads_fused = torch.autograd.grad(y_fused, [x, *fused.parameters()], g)
    grads_ref = torch.autograd.grad(y_ref, [x, *ref.parameters()], g)
    for a, b in zip(grads_fused, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert grads_fused[0].abs().max() > 0


def test_class_token_reads_the_grid_and_is_not_read():
    attn = make_attention(2, backend="fused")
    grid = [3, 3]
    x = torch.randn(1, 10, 12, dtype=torch.float64)
    y = attn(x, grid, has_cls=True)
    x2 = x.clone()
    x2[:, 0] += 1.0  # change only the class token
    y2 = attn(x2, grid, has_cls=True)
    torch.testing.assert_close(y[:, 1:], y2[:, 1:])  # grid tokens do not read the class token
    assert not torch.allclose(y[:, 0], y2[:, 0])
    x3 = x.clone()
    x3[:, 5] += 1.0  # change one grid token: the class token sees it
    assert not torch.allclose(attn(x3, grid, has_cls=True)[:, 0], y[:, 0])


@pytest.mark.parametrize("span", [False, True])
def test_translation_equivariance_of_relative_logits(span):
    """Same content everywhere + relative terms only: logits depend on the offset only."""
    grid = [5, 6]
    sp = DifferentiableSpan(2, 3, init=0.3, mode="multiply") if span else None
    attn = make_attention(2, span=sp)
    x = torch.randn(1, 1, 12, dtype=torch.float64).expand(1, 30, 12)
    logits = attn.logits(x, grid)[0].view(3, 5, 6, 5, 6)
    # pair (i, j) and the pair shifted by (1, 2): same offset, same logit
    torch.testing.assert_close(logits[:, :4, :4, :4, :4], logits[:, 1:, 2:, 1:, 2:], rtol=1e-12, atol=1e-12)
    assert logits[:, 0, 0, 0, 1].sub(logits[:, 0, 0, 1, 0]).abs().max() > 1e-6  # yet offsets differ


def test_absolute_encoding_breaks_translation_equivariance():
    """Control for the test above: an absolute encoding makes the same check fail."""
    from posattn.nn import SinusoidalAbsoluteEncoding

    grid = [5, 6]
    torch.manual_seed(0)
    attn = PositionalSelfAttention(12, 3).double()
    x = torch.randn(1, 1, 12, dtype=torch.float64).expand(1, 30, 12)
    x = SinusoidalAbsoluteEncoding(12, 2)(x, grid)
    logits = attn.logits(x, grid)[0].view(3, 5, 6, 5, 6)
    assert not torch.allclose(logits[:, :4, :4, :4, :4], logits[:, 1:, 2:, 1:, 2:])


def test_fused_attention_keeps_memory_linear_in_n():
    grid = [24, 24]
    N = 576
    torch.manual_seed(0)
    enc = LookupRelativeEncoder(16, 2, 2, max_distance=4)
    attn = PositionalSelfAttention(16, 2, encoder=enc, span=DifferentiableSpan(2, 2), backend="fused")
    x = torch.randn(1, N, 16, requires_grad=True)
    with LargestTensor() as mode:
        attn(x, grid).sum().backward()
    # the largest tensor is the (H, U, D) table, U = prod(2 n - 1) < 4 N: linear in N
    assert mode.numel <= 4 * N * 16 < N * N // 8, mode.numel


def test_span_sigma_is_positive_and_finite_at_the_extremes():
    span = DifferentiableSpan(2, heads=4, per_head=True, init=0.3)
    torch.testing.assert_close(span.sigma(), torch.full((4, 2), 0.3))
    with torch.no_grad():
        span.raw_sigma[0, 0] = -1e4
        span.raw_sigma[1, 1] = 1e4
    s = span.sigma()
    assert torch.isfinite(s).all() and (s > 0).all()
    assert s[0, 0].item() == pytest.approx(span.min_sigma)
    # attention stays finite, with finite gradients, for sigma at its floor
    attn = PositionalSelfAttention(8, 4, encoder=SirenRelativeEncoder(8, 4, 2), span=span, backend="fused")
    for mode in ("add", "multiply"):
        span.mode = mode
        x = torch.randn(2, 12, 8, requires_grad=True)
        y = attn(x, [3, 4])
        y.square().sum().backward()
        assert torch.isfinite(y).all() and torch.isfinite(span.raw_sigma.grad).all() and torch.isfinite(x.grad).all()


def test_span_shared_fixed_and_stats():
    shared = DifferentiableSpan(3, heads=4, init=0.5)
    assert shared.raw_sigma.shape == (1, 3) and shared.sigma().shape == (4, 3)
    fixed = DifferentiableSpan(2, heads=2, learnable=False)
    assert not fixed.learnable and len(list(fixed.parameters())) == 0 and "raw_sigma" in fixed.state_dict()
    span = DifferentiableSpan(2, heads=2, init=0.1, threshold=0.1)
    half = math.ceil(0.1 * math.sqrt(-2 * math.log(0.1)) * 27)  # 28x28 grid
    assert span.half_widths([28, 28]) == [[half, half]] * 2
    stats = span.stats([28, 28])
    assert stats["box"] == [[2 * half + 1] * 2] * 2
    assert 0.0 < stats["keep_fraction"] < ((2 * half + 1) / 28) ** 2
    full = DifferentiableSpan(1, heads=1).stats([9])
    assert full["keep_fraction"] == 1.0 and full["box"] == [[17]]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: DifferentiableSpan(2, init=-0.3), "init"),
        (lambda: DifferentiableSpan(2, init=0.0), "init"),
        (lambda: DifferentiableSpan(2, mode="mul"), "mode must be one of"),
        (lambda: DifferentiableSpan(2, threshold=1.0), "threshold"),
        (lambda: PositionalSelfAttention(10, 3), "multiple of heads"),
        (lambda: PositionalSelfAttention(12, 3, backend="cuda"), "backend must be one of"),
        (lambda: PositionalSelfAttention(12, 3, encoder=SirenRelativeEncoder(12, 4, 1)), "encoder gives"),
        (lambda: PositionalSelfAttention(12, 3, span=DifferentiableSpan(1, heads=2)), "span has 2 heads"),
        (
            lambda: PositionalSelfAttention(12, 3, encoder=SirenRelativeEncoder(12, 3, 2))(torch.randn(1, 8, 12), [8]),
            "built for 2-D grids",
        ),
        (lambda: PositionalSelfAttention(12, 3)(torch.randn(1, 8, 12), [3, 3]), "prod\\(grid\\)"),
        (lambda: PositionalSelfAttention(12, 3, relative=True)(torch.randn(1, 8, 12), [8]), "needs shared="),
    ],
)
def test_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_span_in_cells_keeps_the_same_width_on_every_grid():
    cells = DifferentiableSpan(1, heads=1, init=2.0, threshold=0.1, units="cells")
    normalised = DifferentiableSpan(1, heads=1, init=0.25, threshold=0.1)
    half = math.ceil(2.0 * math.sqrt(-2 * math.log(0.1)))
    for n in (9, 17, 33):
        assert cells.half_widths([n]) == [[half]]
        assert cells.sigma([n]).item() == pytest.approx(2.0 / (n - 1))
    assert normalised.half_widths([9]) != normalised.half_widths([33])  # normalised units scale with the grid
    # the attention gives the operator sigma in normalised units
    attn = PositionalSelfAttention(8, 1, encoder=SirenRelativeEncoder(8, 1, 1), span=cells, backend="fused").double()
    x = torch.randn(1, 17, 8, dtype=torch.float64)
    logits = attn.logits(x, [17])
    assert torch.isinf(logits[0, 0, 0, half + 1]) and torch.isfinite(logits[0, 0, 0, half])
    with pytest.raises(ValueError, match="units must be one of"):
        DifferentiableSpan(1, units="pixels")


def test_every_attention_shares_the_multi_head_base():
    from posattn.nn import (
        AlgebraicSelfAttention,
        ClippedRelativeAttention,
        ClippedWindowAttention,
        FavorAttention,
        MultiHeadSelfAttention,
        RelativeFavorAttention,
        SDPAttention,
    )

    built = [
        PositionalSelfAttention(16, 4),
        SDPAttention(16, 4),
        AlgebraicSelfAttention(16, 4),
        FavorAttention(16, 4),
        RelativeFavorAttention(16, 4, ndim=2),
        ClippedWindowAttention(16, 4, ndim=2),
    ]
    x = torch.randn(2, 12, 16)
    for attn in built:
        assert isinstance(attn, MultiHeadSelfAttention)
        assert attn.head_dim == 4 and attn.qkv.out_features == 48 and attn.proj.in_features == 16
        q, k, v = attn.heads_qkv(x)
        assert q.shape == k.shape == v.shape == (2, 4, 12, 4)
    # strategy 2 as the paper: keys for the content heads only
    attn = ClippedRelativeAttention(16, 4, ndim=2)
    assert isinstance(attn, MultiHeadSelfAttention) and attn.qkv.out_features == 40
    q, k, v = attn.heads_qkv(x)
    assert q.shape == v.shape == (2, 4, 12, 4) and k.shape == (2, 2, 12, 4)
    for cls, extra in ((SDPAttention, {}), (FavorAttention, {}), (ClippedRelativeAttention, {"ndim": 1})):
        with pytest.raises(ValueError, match=f"{cls.__name__}: dim \\(10\\) must be a positive multiple of heads"):
            cls(10, 3, **extra)
    with pytest.raises(ValueError, match="heads >= 2"):
        ClippedRelativeAttention(8, 1, ndim=1)
