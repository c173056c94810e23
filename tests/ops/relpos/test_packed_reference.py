"""posattn.PackedGrids and the reference of packed relpos_attention (issue 62, first step): the
packing's checks, the offset rows each sample reads from the max-grid tables, and the reference's
loop of single-grid calls against a dense construction of the packed call written apart (a
block-diagonal mask over all tokens, offsets and span normalisation per sample)."""

from __future__ import annotations

import math

import pytest
import torch

import posattn
from posattn import PackedGrids, reference
from posattn.grid import grid_coords, offset_rows, span_half_widths
from posattn.packed import sample_offset_rows


def test_from_shapes():
    p = PackedGrids.from_shapes([[2, 3], [4, 4], [1, 5]])
    assert p.offsets.dtype == torch.int32 and p.shapes.dtype == torch.int32
    assert p.offsets.tolist() == [0, 6, 22, 27]
    assert p.shapes.tolist() == [[2, 3], [4, 4], [1, 5]]
    assert p.max_grid == (4, 5) and p.num_samples == len(p) == 3 and p.num_axes == 2 and p.num_tokens == 27
    assert p.samples() == [(0, (2, 3)), (6, (4, 4)), (22, (1, 5))]
    assert PackedGrids.from_shapes([[3]], max_grid=[7]).max_grid == (7,)
    assert "2x3" in repr(p) and "tokens=27" in repr(p)
    # offsets and shapes given apart (tensors of any integer type)
    q = PackedGrids(torch.tensor([0, 6, 22, 27]), torch.tensor([[2, 3], [4, 4], [1, 5]], dtype=torch.int16))
    assert q.offsets.tolist() == p.offsets.tolist() and q.max_grid == p.max_grid
    assert posattn.PackedGrids is PackedGrids


@pytest.mark.parametrize(
    "offsets,shapes,max_grid,match",
    [
        ([1, 7], [[2, 3]], None, r"offsets must start at 0, got offsets\[0\] = 1"),
        (
            [0, 6, 6, 10],
            [[2, 3], [1, 1], [2, 2]],
            None,
            r"offsets must increase, got offsets\[1\] = 6 and offsets\[2\] = 6",
        ),
        ([0, 6, 11], [[2, 3], [2, 3]], None, r"shapes\[1\] = \[2, 3\] has 6 tokens but offsets give it"),
        ([0, 6], [[2, 3], [1, 1]], None, r"offsets must have S \+ 1 = 3 entries"),
        ([0, 0], [[0, 3]], None, r"shapes\[0\] = \[0, 3\] has extent 0 < 1 on axis 0"),
        ([0, 6], [[2, 3]], [2, 2], r"shapes\[0\] = \[2, 3\] exceeds max_grid = \[2, 2\]"),
        ([0, 6], [[2, 3]], [2], r"max_grid must have G = 2 axes"),
        ([0, 2**31], [[2**16, 2**15]], None, r"overflow int32"),
        ([0, 6], [2, 3], None, r"shapes must have 2 dimension"),
        ([0], torch.zeros(0, 2, dtype=torch.int64), None, r"at least one sample"),
    ],
)
def test_bad_packing(offsets, shapes, max_grid, match):
    with pytest.raises(ValueError, match=match):
        PackedGrids(offsets, shapes, max_grid)


def test_bad_packing_types():
    with pytest.raises(TypeError, match="offsets must hold integers"):
        PackedGrids(torch.tensor([0.0, 6.0]), [[2, 3]])
    with pytest.raises(TypeError, match="shapes must be a sequence of ints"):
        PackedGrids.from_shapes([["a", 3]])


def test_sample_offset_rows():
    # grid (2, 3) inside max_grid (3, 4): offsets delta in [-1, 1] x [-2, 2] at rows of the (5, 7) table
    rows = sample_offset_rows([2, 3], [3, 4])
    want = [(d0 + 2) * 7 + (d1 + 3) for d0 in (-1, 0, 1) for d1 in (-2, -1, 0, 1, 2)]
    assert rows.tolist() == want
    assert sample_offset_rows([3, 4], [3, 4]).tolist() == list(range(5 * 7))


def _inputs(H, T, D, U, g, dtype=torch.float64):
    x = dict(
        q=torch.randn(1, H, T, D, generator=g, dtype=dtype),
        k=torch.randn(1, H, T, D, generator=g, dtype=dtype),
        v=torch.randn(1, H, T, D, generator=g, dtype=dtype),
        q_pos=torch.randn(1, H, T, D, generator=g, dtype=dtype),
        rel=torch.randn(H, U, D, generator=g, dtype=dtype),
        bias=torch.randn(H, U, generator=g, dtype=dtype),
    )
    return {k: t.requires_grad_() for k, t in x.items()}


@pytest.mark.parametrize("shape", [[5, 7], [3, 1, 4]])
def test_one_sample_is_the_single_grid_call(shape):
    # S = 1 with max_grid == shape: bit for bit the call on that grid
    g = torch.Generator().manual_seed(0)
    G = len(shape)
    x = _inputs(2, math.prod(shape), 8, math.prod(2 * n - 1 for n in shape), g)
    sigma = torch.rand(2, G, generator=g, dtype=torch.float64) + 0.3
    args = dict(sigma=sigma, threshold=0.2, causal=True, window=[2] * G, return_lse=True)
    got = reference.relpos_attention(**x, packed=PackedGrids.from_shapes([shape]), **args)
    want = reference.relpos_attention(**x, grid=shape, **args)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _dense_packed(q, k, v, q_pos, rel, bias, packed, sigma, threshold, span_mode, causal):
    """The packed call written as one (T, T) problem: a key counts for a query of the same sample
    only; offsets, span normalisation and span box per sample; rows of the max-grid tables."""
    H, T, D = q.shape[1], q.shape[2], q.shape[3]
    sid = torch.full((T,), -1, dtype=torch.long)
    coords = torch.zeros(T, packed.num_axes, dtype=torch.long)
    denom = torch.ones(T, packed.num_axes, dtype=q.dtype)
    half = torch.zeros(H, T, packed.num_axes, dtype=torch.long)
    for s, (start, shape) in enumerate(packed.samples()):
        n = math.prod(shape)
        sid[start : start + n] = s
        coords[start : start + n] = grid_coords(shape)
        denom[start : start + n] = torch.tensor([max(m - 1, 1) for m in shape], dtype=q.dtype)
        if threshold > 0:
            box = torch.tensor(span_half_widths(sigma, threshold, shape)).reshape(H, len(shape))
            half[:, start : start + n] = box[:, None, :]
    delta = coords[None, :, :] - coords[:, None, :]  # (T, T, G)
    same = (sid[:, None] == sid[None, :]) & (sid[:, None] >= 0)
    rows = torch.where(same, offset_rows(delta, packed.max_grid), 0)
    scale = D**-0.5
    s = scale * (q @ k.transpose(-1, -2)) + scale * (q_pos @ rel.transpose(-1, -2)).gather(-1, rows.expand(1, H, T, T))
    s = s + bias[:, rows]
    x = delta.to(q.dtype) / denom[:, None, :]
    quad = 0.5 * ((x[None] / sigma[:, None, None, :]) ** 2).sum(-1)
    s = s - quad if span_mode == "add" else s * torch.exp(-quad)
    keep = same[None].expand(H, T, T)
    if threshold > 0:
        keep = keep & (delta.abs()[None] <= half[:, :, None, :]).all(-1)
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~keep, float("-inf"))
    empty = torch.isneginf(s).all(-1, keepdim=True)
    lse = torch.logsumexp(s.masked_fill(empty, 0.0), -1).masked_fill(empty[..., 0], float("-inf"))
    p = torch.exp(s - lse[..., None].masked_fill(empty, 0.0)).masked_fill(empty, 0.0)
    return p @ v, lse


@pytest.mark.parametrize(
    "shapes,max_grid,tail,span_mode,causal,threshold",
    [
        ([[3, 4], [5, 2], [1, 1], [4, 4]], None, 3, "add", False, 0.0),
        ([[3, 4], [5, 2], [4, 4]], [6, 5], 0, "multiply", True, 0.3),
        ([[2, 3, 1], [1, 2, 4], [3, 3, 3]], None, 2, "add", True, 0.25),
    ],
)
def test_packed_reference_against_the_dense_packed_call(shapes, max_grid, tail, span_mode, causal, threshold):
    g = torch.Generator().manual_seed(1)
    packed = PackedGrids.from_shapes(shapes, max_grid=max_grid)
    H, D = 2, 6
    T = packed.num_tokens + tail
    x = _inputs(H, T, D, math.prod(2 * m - 1 for m in packed.max_grid), g)
    sigma = (torch.rand(H, packed.num_axes, generator=g, dtype=torch.float64) + 0.3).requires_grad_()
    args = dict(sigma=sigma, threshold=threshold, span_mode=span_mode, causal=causal)
    out, lse = reference.relpos_attention(**x, packed=packed, return_lse=True, **args)
    want_out, want_lse = _dense_packed(**x, packed=packed, **args)
    assert torch.allclose(out, want_out, atol=1e-12) and torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    assert torch.allclose(lse[~torch.isneginf(lse)], want_lse[~torch.isneginf(want_lse)], atol=1e-12)
    assert torch.isneginf(lse[..., packed.num_tokens :]).all() and (out[..., packed.num_tokens :, :] == 0).all()
    gout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    finite = ~torch.isneginf(lse)
    leaves = [*x.values(), sigma]
    got = torch.autograd.grad((out * gout).sum() + lse[finite].sum(), leaves)
    want = torch.autograd.grad((want_out * gout).sum() + want_lse[finite].sum(), leaves)
    for name, a, b in zip([*x, "sigma"], got, want):
        assert torch.allclose(a, b, atol=1e-10), name
    # tail padding gets zero gradients
    assert (got[0][..., packed.num_tokens :, :] == 0).all()


def test_packed_reference_bad_calls():
    packed = PackedGrids.from_shapes([[2, 2], [3, 1]])
    q = torch.randn(1, 1, 7, 4)
    with pytest.raises(ValueError, match="grid must be None"):
        reference.relpos_attention(q, q, q, grid=[7], packed=packed)
    with pytest.raises(ValueError, match=r"q must be \(1, H, T, D\)"):
        reference.relpos_attention(q.expand(2, 1, 7, 4), q.expand(2, 1, 7, 4), q.expand(2, 1, 7, 4), packed=packed)
    with pytest.raises(ValueError, match="packed holds 7 tokens but q has only T = 6"):
        reference.relpos_attention(q[:, :, :6], q[:, :, :6], q[:, :, :6], packed=packed)
    with pytest.raises(ValueError, match="window_dilation is not supported"):
        reference.relpos_attention(q, q, q, window=[1, 1], window_dilation=[2, 1], packed=packed)
    with pytest.raises(TypeError, match="packed must be a posattn.PackedGrids"):
        reference.relpos_attention(q, q, q, packed=[[2, 2], [3, 1]])


def test_greedy_pack():
    from posattn.packed import greedy_pack

    counts = [5, 9, 3, 7, 2, 4, 8]
    groups = greedy_pack(counts, 10)
    assert sorted(i for g in groups for i in g) == list(range(len(counts)))  # every sample once
    assert all(sum(counts[i] for i in g) <= 10 for g in groups)
    # first fit, largest first: 9, 8, 7 and 5 open groups; 4 joins 5's, 3 joins 7's, 2 joins 8's
    assert groups == [[1], [4, 6], [2, 3], [0, 5]]
    assert greedy_pack(counts, 10) == groups  # deterministic
    assert len(greedy_pack([1] * 12, 4)) == 3
    with pytest.raises(ValueError, match=r"token_counts\[1\] = 11 exceeds the budget of 10"):
        greedy_pack([3, 11], 10)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        greedy_pack([1], 0)


def test_patchify():
    from posattn.packed import patchify

    image = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)
    tokens, grid = patchify(image, 2)
    assert grid == (2, 3) and tokens.shape == (6, 8)
    # token (1, 2): rows 2-3, columns 4-5 of the image, each pixel's two channels
    assert tokens[1 * 3 + 2].tolist() == [16, 40, 17, 41, 22, 46, 23, 47]
    # as the classifier cuts a (1, H, W, C) image
    from posattn.nn import TransformerClassifier

    model = TransformerClassifier(grid=[4, 6], in_channels=2, dim=8, heads=2, depth=1, num_classes=2, patch_size=2)
    assert torch.equal(model.patchify(image.permute(1, 2, 0)[None]).reshape(6, 8), tokens)
    with pytest.raises(ValueError, match="patch = 4 must divide"):
        patchify(image, 4)
