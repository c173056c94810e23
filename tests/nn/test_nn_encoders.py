"""Positional encoders: shapes, dtype/device, gradients, init, table indexing."""

import math

import pytest
import torch

from posattn.grid import num_offsets, relative_offsets
from posattn.nn import (
    LearnableSinusoidEncoding,
    LearnedAbsoluteEncoding,
    LookupRelativeEncoder,
    SinusoidalAbsoluteEncoding,
    SinusoidalRelativeEncoder,
    SirenRelativeEncoder,
)

GRIDS = [[7], [3, 4], [1, 5], [2, 3, 2], [4, 1, 3]]


def relative_encoders(ndim, dim=12, heads=3):
    return {
        "siren": SirenRelativeEncoder(dim, heads, ndim, hidden_dim=16, w0=10.0),
        "sinusoidal": SinusoidalRelativeEncoder(dim, heads, ndim, num_features=8),
        "lookup": LookupRelativeEncoder(dim, heads, ndim, max_distance=2),
    }


def absolute_encodings(grid, dim=12):
    return {
        "abs_sinusoidal": SinusoidalAbsoluteEncoding(dim if dim % (2 * len(grid)) == 0 else 12, len(grid)),
        "abs_learned": LearnedAbsoluteEncoding(dim, grid),
        "abs_learnable_sinusoid": LearnableSinusoidEncoding(dim, len(grid)),
    }


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("name", ["siren", "sinusoidal", "lookup"])
def test_relative_table_shape_dtype_and_grads(grid, name):
    torch.manual_seed(0)
    enc = relative_encoders(len(grid))[name]
    table = enc(grid)
    assert table.shape == (3, num_offsets(grid), 4)
    assert table.dtype == torch.float32 and torch.isfinite(table).all()
    assert table.abs().max() > 0
    (table * torch.randn_like(table)).sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, pname
    enc64 = enc.double()
    assert enc64(grid).dtype == torch.float64
    torch.testing.assert_close(enc64(grid).float(), table.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["siren", "sinusoidal", "lookup"])
def test_relative_table_follows_device(name):
    enc = relative_encoders(2)[name].to("meta")
    table = enc([3, 5])
    assert table.device.type == "meta" and table.shape == (3, 5 * 9, 4)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["siren", "sinusoidal", "lookup"])
def test_relative_table_on_cuda_matches_cpu(name):
    enc = relative_encoders(2)[name]
    torch.testing.assert_close(enc.cuda()([3, 5]).cpu(), enc.cpu()([3, 5]), rtol=1e-5, atol=1e-5)


def siren_direct(enc, delta, grid):
    """The SIREN applied to one offset, written out."""
    h = torch.tensor([d / max(n - 1, 1) for d, n in zip(delta, grid)], dtype=torch.float64)
    for layer in enc.sine_layers:
        h = torch.sin(enc.w0 * (layer.weight.double() @ h + layer.bias.double()))
    return enc.out.weight.double() @ h + enc.out.bias.double()


@pytest.mark.parametrize("grid", [[6], [3, 4], [2, 3, 3]])
def test_siren_rows_are_the_offsets_the_operator_uses(grid):
    torch.manual_seed(1)
    enc = SirenRelativeEncoder(8, 2, len(grid), hidden_dim=16).double()
    table = enc(grid)
    offsets = relative_offsets(grid)
    for u in [0, 1, num_offsets(grid) // 2, num_offsets(grid) - 1, 3]:
        delta = offsets[u].tolist()
        expected = siren_direct(enc, delta, grid).view(2, 4)
        torch.testing.assert_close(table[:, u], expected, rtol=1e-12, atol=1e-12)
    assert offsets[num_offsets(grid) // 2].abs().sum() == 0  # the centre row is offset 0


def test_siren_initialisation_ranges():
    torch.manual_seed(0)
    enc = SirenRelativeEncoder(64, 8, 2, hidden_dim=64, hidden_layers=2, w0=10.0)
    first, hidden = enc.sine_layers
    assert first.weight.abs().max() <= 1 / 2 and first.weight.abs().max() > 0.4
    bound = math.sqrt(6 / 64) / 10
    assert hidden.weight.abs().max() <= bound and hidden.weight.abs().max() > 0.9 * bound
    out_bound = math.sqrt(3 / 64)  # kaiming uniform, linear gain
    assert enc.out.weight.abs().max() <= out_bound and enc.out.weight.abs().max() > 0.9 * out_bound
    for layer in (first, hidden, enc.out):
        assert torch.all(layer.bias == 0)
    assert SirenRelativeEncoder(8, 2, 1, w0=30.0).w0 == 30.0


def test_sinusoidal_relative_is_the_thesis_baseline_in_1d():
    torch.manual_seed(0)
    enc = SinusoidalRelativeEncoder(6, 2, 1, num_features=4).double()
    table = enc([5])  # offsets -4..4
    for u, delta in enumerate(range(-4, 5)):
        f = torch.tensor([1.0, 10000 ** (-2 / 4)], dtype=torch.float64)
        feats = torch.cat([torch.sin(delta * f), torch.cos(delta * f)])
        torch.testing.assert_close(table[:, u].reshape(6), enc.out.weight @ feats + enc.out.bias)


def test_lookup_clips_each_axis():
    torch.manual_seed(0)
    enc = LookupRelativeEncoder(4, 1, 2, max_distance=1)
    grid = [4, 3]
    table = enc(grid)[0]
    offsets = relative_offsets(grid)

    def row(d0, d1):
        return table[((offsets[:, 0] == d0) & (offsets[:, 1] == d1)).nonzero().item()]

    torch.testing.assert_close(row(3, 2), row(1, 1))
    torch.testing.assert_close(row(-2, 0), row(-1, 0))
    assert not torch.equal(row(1, 0), row(0, 0))
    assert enc.table.shape == (9, 4)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("name", ["abs_sinusoidal", "abs_learned", "abs_learnable_sinusoid"])
def test_absolute_shapes_dtype_device_grads(grid, name):
    torch.manual_seed(0)
    enc = absolute_encodings(grid)[name]
    N = math.prod(grid)
    x = torch.randn(2, N, enc.dim, dtype=torch.float64, requires_grad=True)
    y = enc.double()(x, grid)
    assert y.shape == x.shape and y.dtype == torch.float64
    pe = y - x
    assert torch.allclose(pe[0], pe[1]) and pe.abs().max() > 0
    assert len({tuple(r) for r in pe[0].round(decimals=6).tolist()}) == N  # every cell distinct
    y.pow(2).sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, pname
    assert enc.to("meta").encode(grid, device="meta").device.type == "meta"


def test_vaswani_formula_1d():
    enc = SinusoidalAbsoluteEncoding(8, 1)
    pe = enc.encode([5], dtype=torch.float64)
    for p in range(5):
        for i in range(4):
            f = 10000 ** (-2 * i / 8)
            assert pe[p, i].item() == pytest.approx(math.sin(p * f))
            assert pe[p, 4 + i].item() == pytest.approx(math.cos(p * f))


def test_vaswani_2d_concatenates_axes():
    pe = SinusoidalAbsoluteEncoding(8, 2).encode([3, 4], dtype=torch.float64).view(3, 4, 8)
    row_part = SinusoidalAbsoluteEncoding(4, 1).encode([3], dtype=torch.float64)
    col_part = SinusoidalAbsoluteEncoding(4, 1).encode([4], dtype=torch.float64)
    torch.testing.assert_close(pe[:, 2, :4], row_part)
    torch.testing.assert_close(pe[1, :, 4:], col_part)


def test_learned_table_on_smaller_grid_and_errors():
    enc = LearnedAbsoluteEncoding(4, [5, 6])
    torch.testing.assert_close(enc.encode([2, 3]).view(2, 3, 4), enc.table[:2, :3].detach())
    with pytest.raises(ValueError, match="exceeds the table's grid"):
        enc.encode([6, 6])
    with pytest.raises(ValueError, match="built for 2-D grids"):
        enc.encode([30])


def test_learnable_sinusoid_has_published_parameter_count():
    # The Performer paper's model (dim 128, 2-D) lists 32 parameters for it.
    assert sum(p.numel() for p in LearnableSinusoidEncoding(128, 2).parameters()) == 32


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: SirenRelativeEncoder(10, 3, 2), "multiple of heads"),
        (lambda: SinusoidalRelativeEncoder(12, 3, 1, num_features=5), "even"),
        (lambda: LookupRelativeEncoder(12, 3, 1, max_distance=-1), "max_distance"),
        (lambda: SinusoidalAbsoluteEncoding(10, 3), "divisible by 2 \\* ndim"),
        (lambda: SirenRelativeEncoder(12, 3, 2, w0=0.0), "w0"),
        (lambda: SirenRelativeEncoder(12, 3, 2)([4, 4, 4]), "built for 2-D grids"),
    ],
)
def test_encoder_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()
