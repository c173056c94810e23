"""posattn.nn with packed grids (issue 62): PositionalSelfAttention and the classifier on images of
different sizes in one sequence equal the same modules run on each image alone (with encoders
that depend on the offsets only), gradients reach every positional parameter, and what packing
cannot take is refused with a clear error."""

from __future__ import annotations

import math

import pytest
import torch

from posattn import PackedGrids
from posattn.nn import DifferentiableSpan, LookupRelativeEncoder, PositionalSelfAttention, RelativePositionBias
from posattn.nn.transformer import TransformerClassifier

SHAPES = [[3, 4], [5, 2], [1, 6], [4, 4]]


def attention(span_units="normalised", backend="auto"):
    torch.manual_seed(0)
    H, dim = 2, 8
    return PositionalSelfAttention(
        dim, H, encoder=LookupRelativeEncoder(dim, H, 2, max_distance=3),
        span=DifferentiableSpan(2, H, per_head=True, threshold=0.1, units=span_units),
        position_bias=RelativePositionBias(H, 2, "table", max_distance=4), window=[2, 1], backend=backend,
    ).double()  # fmt: skip


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_attention_packed_equals_each_sample_alone(backend):
    m = attention(backend=backend)
    pk = PackedGrids.from_shapes(SHAPES, max_grid=[6, 6])
    T = pk.num_tokens + 5
    x = torch.randn(1, T, 8, dtype=torch.float64)
    out = m(x, pk)
    assert out.shape == (1, T, 8)
    for start, shape in pk.samples():
        n = math.prod(shape)
        alone = m(x[:, start : start + n], shape)
        torch.testing.assert_close(out[:, start : start + n], alone, atol=1e-12, rtol=0)
    params = [m.encoder.table, m.position_bias.table, m.span.raw_sigma, m.u_bias, m.v_bias]
    grads = torch.autograd.grad(out[:, : pk.num_tokens].square().sum(), params)
    assert all(g.abs().sum() > 0 for g in grads)


def test_attention_packed_errors():
    pk = PackedGrids.from_shapes(SHAPES)
    x = torch.randn(1, pk.num_tokens, 8, dtype=torch.float64)
    m = attention()
    with pytest.raises(ValueError, match="class token is not supported with packed grids"):
        m(torch.cat([x[:, :1], x], dim=1), pk, has_cls=True)
    with pytest.raises(ValueError, match=r"with packed grids x must have shape \(1, T, 8\)"):
        m(torch.cat([x, x]), pk)
    with pytest.raises(ValueError, match="hold 44 tokens but x has only T = 43"):
        m(x[:, :-1], pk)
    with pytest.raises(ValueError, match="units='cells' is not supported with packed grids"):
        attention(span_units="cells")(x, pk)
    with pytest.raises(ValueError, match="one grid only"):
        m.logits(x, pk)


def classifier(**kw):
    torch.manual_seed(1)
    cfg = dict(grid=[8, 8], in_channels=1, dim=16, heads=2, depth=2, num_classes=5, pooling="mean")
    cfg.update(pe={"name": "lookup", "max_distance": 4}, span={"enabled": True, "threshold": 0.05})
    cfg.update(kw)
    return TransformerClassifier(**cfg).double().eval()


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
@pytest.mark.parametrize("positions", ["grid", "sequence"])
def test_classifier_packed_equals_each_image_alone(pooling, positions):
    m = classifier(pooling=pooling, positions=positions)
    shapes = [[3, 5], [6, 4], [2, 2], [8, 7]]
    images = [torch.randn(h, w, 1, dtype=torch.float64) for h, w in shapes]
    pk = PackedGrids.from_shapes(shapes, max_grid=[8, 8])
    tokens = torch.cat([im.reshape(-1, 1) for im in images] + [torch.zeros(3, 1, dtype=torch.float64)])
    logits = m.forward_packed(tokens, pk)
    alone = torch.cat([m(im[None]) for im in images])
    torch.testing.assert_close(logits, alone, atol=1e-10, rtol=0)


def test_classifier_packed_trains():
    m = classifier().train()
    pk = PackedGrids.from_shapes([[4, 5], [7, 3]])
    tokens = torch.randn(1, pk.num_tokens, 1, dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(m.forward_packed(tokens, pk), torch.tensor([1, 3]))
    loss.backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_classifier_packed_errors():
    pk = PackedGrids.from_shapes([[4, 5], [7, 3]])
    tokens = torch.randn(1, pk.num_tokens, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="pooling 'cls' is not supported"):
        classifier(pooling="cls").forward_packed(tokens, pk)
    with pytest.raises(ValueError, match="packed grids need attention='relpos'"):
        classifier(pe={"name": "abs_sinusoidal"}).forward_packed(tokens, pk)
    with pytest.raises(ValueError, match="packed grids need attention='relpos'"):
        classifier(attention="sdpa", pe={"name": "none"}, span={"enabled": False}).forward_packed(tokens, pk)
    with pytest.raises(ValueError, match=r"tokens must have shape \(1, T, 1\)"):
        classifier().forward_packed(tokens.expand(1, -1, 3), pk)
    with pytest.raises(ValueError, match="packed grids of 1 axes, the model's grid has 2"):
        classifier().forward_packed(tokens, PackedGrids.from_shapes([[20], [21]]))
