"""RelativePositionBias (table, T5 buckets, SwinV2 continuous) and its use in
PositionalSelfAttention and the classifier (pe.bias, model.window)."""

import pytest
import torch

from posattn.grid import num_offsets, relative_offsets
from posattn.nn import ModelConfig, PositionalSelfAttention, RelativePositionBias, TransformerClassifier
from posattn.nn.bias import t5_buckets


def hf_bucket_fn():
    t5 = pytest.importorskip(
        "transformers.models.t5.modeling_t5", reason="transformers is not installed (requirements-dev.txt pins it)"
    )
    return t5.T5Attention._relative_position_bucket


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "unidirectional"])
def test_t5_buckets_bit_for_bit_with_transformers(bidirectional):
    """Every setting num_buckets 2..64 x max_distance 1..512, offsets to +-3 max_distance:
    posattn's buckets equal transformers' own function's, or posattn refuses the
    setting where T5's arithmetic is undefined (it returns garbage there)."""
    hf = hf_bucket_fn()
    compared = refused = 0
    for nb in range(2, 65):
        for md in range(1, 513):
            delta = torch.arange(-3 * md - 3, 3 * md + 4)
            try:
                got = t5_buckets(delta, nb, md, bidirectional)
            except ValueError as e:
                assert "num_buckets" in str(e) or "max_distance" in str(e)
                refused += 1
                continue
            want = hf(delta, bidirectional=bidirectional, num_buckets=nb, max_distance=md)
            if not torch.equal(got, want):
                bad = (got != want).nonzero().flatten()[:5]
                raise AssertionError(
                    f"num_buckets={nb} max_distance={md}: offsets {delta[bad].tolist()} -> "
                    f"posattn {got[bad].tolist()}, transformers {want[bad].tolist()}"
                )
            assert 0 <= int(got.min()) and int(got.max()) < nb
            compared += 1
    assert compared > 30000 and refused > 0


@pytest.mark.parametrize(
    "nb,md,offsets,bidirectional",
    [(18, 128, [16, -16, 64, -64], True), (34, 27, [18, -18], True), (32, 128, list(range(-300, 301)), True)],
)
def test_t5_buckets_where_a_float64_log_differs(nb, md, offsets, bidirectional):
    """The settings where the old float64 log gave other buckets than T5."""
    hf = hf_bucket_fn()
    delta = torch.tensor(offsets)
    assert torch.equal(t5_buckets(delta, nb, md, bidirectional), hf(delta, bidirectional, nb, md))


def test_t5_buckets_refuse_where_t5_is_undefined():
    hf = hf_bucket_fn()
    delta = torch.arange(-40, 41)
    for nb, md, bi, match in [
        (2, 10, True, "num_buckets must be >= 4"),
        (3, 10, True, "num_buckets must be >= 4"),
        (1, 10, False, "num_buckets must be >= 2"),
        (32, 8, True, "max_distance must be > 8"),
        (16, 8, False, "max_distance must be > 8"),
    ]:
        with pytest.raises(ValueError, match=match):
            t5_buckets(delta, nb, md, bi)
        try:  # T5 itself divides by zero there, or gives buckets out of range
            got = hf(delta, bidirectional=bi, num_buckets=nb, max_distance=md)
        except ZeroDivisionError:
            continue
        assert not ((got >= 0) & (got < nb)).all()
    with pytest.raises(ValueError, match="RelativePositionBias: max_distance must be > 8"):
        RelativePositionBias(2, 1, kind="t5", num_buckets=32, max_distance=8)


@pytest.mark.parametrize("grid", [[7], [3, 4], [2, 3, 2]])
def test_table_clips_each_axis(grid):
    bias = RelativePositionBias(heads=3, ndim=len(grid), kind="table", max_distance=1)
    b = bias(grid)
    assert b.shape == (3, num_offsets(grid))
    delta = relative_offsets(grid)
    clipped = delta.clamp(-1, 1)
    # Offsets that clip to the same per-axis value share their entry; distinct ones do not.
    for u in range(delta.shape[0]):
        same = (clipped == clipped[u]).all(-1)
        assert torch.equal(b[:, same], b[:, u : u + 1].expand(-1, int(same.sum())))
    assert torch.unique(b[0]).numel() == 3 ** len(grid)


def test_table_entry_of_an_offset():
    bias = RelativePositionBias(heads=2, ndim=2, kind="table", max_distance=[2, 1])
    with torch.no_grad():
        bias.table.copy_(torch.arange(2 * 15, dtype=torch.float32).view(2, 15))
    b = bias([4, 4])
    delta = relative_offsets([4, 4])
    u = int(((delta[:, 0] == -3) & (delta[:, 1] == 1)).nonzero())
    assert b[1, u].item() == 15 + (0 * 3 + 2)  # axis 0 clipped to -2 -> 0, axis 1 offset 1 -> 2


def test_t5_bias_and_cpb_shapes_and_gradients():
    for kind in ("t5", "cpb"):
        bias = RelativePositionBias(heads=4, ndim=2, kind=kind, num_buckets=8, hidden=16)
        b = bias([5, 6])
        assert b.shape == (4, 9 * 11)
        b.square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in bias.parameters())
    cpb = RelativePositionBias(heads=2, ndim=1, kind="cpb", hidden=8)
    b = cpb([10])
    assert ((b > 0) & (b < 16)).all()
    assert cpb([31]).shape == (2, 61)  # any grid size: the MLP reads normalised offsets


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        RelativePositionBias(2, 2, kind="swin")
    with pytest.raises(ValueError, match="num_buckets must be even"):
        RelativePositionBias(2, 2, kind="t5", num_buckets=7)
    with pytest.raises(ValueError, match="max_distance must be an int or 2 ints"):
        RelativePositionBias(2, 2, max_distance=[1, 2, 3])
    with pytest.raises(ValueError, match="max_distance must be >= 0"):
        RelativePositionBias(2, 2, max_distance=-1)
    with pytest.raises(ValueError, match="built for 2-D grids"):
        RelativePositionBias(2, 2)([5])
    with pytest.raises(ValueError, match="position_bias has 3 heads"):
        PositionalSelfAttention(8, 2, position_bias=RelativePositionBias(3, 2))
    with pytest.raises(ValueError, match="window_border must be one of"):
        PositionalSelfAttention(8, 2, window=1, window_border="wrap")


@pytest.mark.parametrize("kind,window,border", [("table", 1, "clip"), ("t5", [1, 2], "shift"), ("cpb", None, "clip")])
def test_attention_fused_matches_reference(kind, window, border):
    torch.manual_seed(0)
    grid = [5, 6]
    attn = PositionalSelfAttention(
        16,
        2,
        position_bias=RelativePositionBias(2, 2, kind, hidden=8, num_buckets=8),
        window=window,
        window_border=border,
    ).double()
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    outs, grads = [], []
    for backend in ("fused", "reference"):
        attn.backend = backend
        out = attn(x, grid)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), list(attn.parameters())))
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_window_limits_what_a_token_sees():
    """A token's output does not depend on tokens outside its window."""
    torch.manual_seed(1)
    grid = [6, 6]
    attn = PositionalSelfAttention(8, 2, position_bias=RelativePositionBias(2, 2), window=1).double()
    x = torch.randn(1, 36, 8, dtype=torch.float64)
    y = x.clone()
    y[0, 35] += 1.0  # token (5, 5): outside the 3x3 window of token (0, 0)
    assert torch.equal(attn(x, grid)[0, 0], attn(y, grid)[0, 0])
    assert not torch.equal(attn(x, grid)[0, 28], attn(y, grid)[0, 28])  # token (4, 4) sees it


@pytest.mark.parametrize("kind", ["table", "t5", "cpb"])
def test_classifier_with_bias_and_window(kind):
    torch.manual_seed(0)
    model = TransformerClassifier(
        grid=[8, 8],
        dim=16,
        heads=2,
        depth=2,
        pe={"name": "none", "bias": kind, "bias_hidden": 8},
        window=3,
        window_border="shift",
    )
    assert model.blocks[0].attention.window == 1
    logits = model(torch.randn(3, 8, 8, 1))
    assert logits.shape == (3, 10)
    logits.sum().backward()
    for block in model.blocks:
        for p in block.attention.position_bias.parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "values,match",
    [
        (dict(window=4), "window must be an odd window size"),
        (dict(window=0), "window must be an int >= 1"),
        (dict(window=3, attention="sdpa", pe={"name": "none"}), "window needs attention='relpos'"),
        (dict(pe={"bias": "t55"}), "pe.bias must be one of .*did you mean 't5'"),
        (dict(pe={"name": "none", "bias": "table"}, attention="favor"), "pe.bias='table' needs attention='relpos'"),
        (dict(pe={"bias": "t5", "bias_buckets": 9}), "pe.bias_buckets must be even"),
        (dict(window=3, window_border="natten"), "window_border must be one of"),
    ],
)
def test_config_errors(values, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict(values)
