"""TransformerClassifier, EncoderBlock and ModelConfig."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.nn import quadrant_task

from posattn.nn import ModelConfig, TransformerClassifier
from posattn.nn.registry import POSITIONAL_ENCODINGS

SMALL = dict(grid=[5, 4], dim=16, depth=2, heads=2, ffn_dim=32, num_classes=3)


def test_thesis_defaults_have_the_published_parameter_count():
    model = TransformerClassifier(ModelConfig(in_channels=3, grid=[32, 32]))
    assert 0.25e6 < model.num_parameters() < 0.27e6  # thesis: ~0.26 M
    cfg = model.config
    assert (cfg.depth, cfg.dim, cfg.heads, cfg.ffn_dim, cfg.norm, cfg.pooling) == (6, 64, 8, 128, "post", "last")
    assert cfg.pe.name == "siren" and len(model.blocks) == 6
    assert all(b.attention.encoder is not None for b in model.blocks)  # one SIREN per layer


@pytest.mark.parametrize("pe", POSITIONAL_ENCODINGS)
@pytest.mark.parametrize("pooling", ["last", "mean", "max", "cls"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_every_encoding_pooling_and_norm_trains_a_step(pe, pooling, norm):
    torch.manual_seed(0)
    model = TransformerClassifier(**SMALL, pe={"name": pe, "max_distance": 2}, pooling=pooling, norm=norm)
    x = torch.rand(3, 5, 4, 1)
    logits = model(x)
    assert logits.shape == (3, 3) and torch.isfinite(logits).all()
    F.cross_entropy(logits, torch.tensor([0, 1, 2])).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("positions, expected_rows", [("grid", 9 * 7), ("sequence", 2 * 20 - 1)])
def test_sequence_or_grid_positions_of_the_same_data(positions, expected_rows):
    torch.manual_seed(0)
    model = TransformerClassifier(**SMALL, positions=positions)
    assert model.attention_grid([5, 4]) == ([5, 4] if positions == "grid" else [20])
    assert model.blocks[0].attention.encoder(model.attention_grid([5, 4])).shape == (2, expected_rows, 8)
    assert model(torch.rand(2, 5, 4, 1)).shape == (2, 3)


def test_shared_encoder_table_computed_once_per_forward():
    torch.manual_seed(0)
    model = TransformerClassifier(**SMALL, pe={"name": "siren", "shared": True})
    assert model.shared_encoder is not None and all(b.attention.encoder is None for b in model.blocks)
    calls = []
    model.shared_encoder.register_forward_hook(lambda *a: calls.append(1))
    model(torch.rand(2, 5, 4, 1))
    assert len(calls) == 1
    per_layer = TransformerClassifier(**SMALL)
    assert per_layer.num_parameters() > model.num_parameters()


def test_span_stats_per_layer():
    model = TransformerClassifier(**SMALL, span={"enabled": True, "threshold": 0.1, "init": 0.2, "per_head": True})
    stats = model.span_stats()
    assert set(stats) == {f"layer{i}/{k}" for i in range(2) for k in ("sigma", "box", "keep_fraction")}
    half = [math.ceil(0.2 * math.sqrt(-2 * math.log(0.1)) * (n - 1)) for n in (5, 4)]
    assert stats["layer0/box"] == [[2 * h + 1 for h in half]] * 2
    assert sum(stats["layer1/sigma"], []) == pytest.approx([0.2] * 4)
    assert TransformerClassifier(**SMALL).span_stats() == {}


def test_state_dict_round_trip_and_dtype_device_follow():
    torch.manual_seed(0)
    kw = dict(SMALL, span={"enabled": True}, pe={"name": "lookup"}, pooling="cls")
    model = TransformerClassifier(**kw).eval()
    x = torch.rand(2, 5, 4, 1)
    other = TransformerClassifier(**kw).eval()
    other.load_state_dict(model.state_dict(), strict=True)
    torch.testing.assert_close(other(x), model(x))
    y64 = model.double()(x.double())
    assert y64.dtype == torch.float64
    torch.testing.assert_close(y64.float(), other(x), rtol=1e-4, atol=1e-5)
    assert model.to("meta")(x.to("meta")).device.type == "meta"


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    model = TransformerClassifier(**SMALL, span={"enabled": True, "threshold": 0.2}).eval()
    x = torch.rand(2, 5, 4, 1)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    torch.testing.assert_close(y, model(x))
    grads = torch.autograd.grad(y.sum(), list(model.parameters()))
    eager = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    for a, b in zip(grads, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_blocks_without_residual_or_norm():
    torch.manual_seed(0)
    model = TransformerClassifier(**SMALL, residual=False, norm="none")
    assert not any(isinstance(m, torch.nn.LayerNorm) for b in model.blocks for m in b.modules())
    assert torch.isfinite(model(torch.rand(2, 5, 4, 1))).all()


def train_quadrants(pe: str, steps: int = 120, seed: int = 0) -> float:
    torch.manual_seed(seed)
    model = TransformerClassifier(
        grid=[8, 8],
        dim=32,
        depth=2,
        heads=4,
        ffn_dim=64,
        num_classes=4,
        dropout=0.0,
        input_dropout=0.0,
        pe={"name": pe},
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = quadrant_task(2048, seed=1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (64,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    x_test, y_test = quadrant_task(1024, seed=2)
    with torch.no_grad():
        return (model(x_test).argmax(-1) == y_test).float().mean().item()


@pytest.mark.slow
def test_relative_encoding_learns_where_the_bright_pixel_is():
    """Position is the whole task: SIREN relative encoding far above chance (0.25),
    the model without positions stays at chance."""
    assert train_quadrants("siren") > 0.8
    assert train_quadrants("none") < 0.35


@pytest.mark.parametrize(
    "values, match",
    [
        (dict(pe={"name": "sirne"}), "pe.name must be one of .*'siren'.*did you mean 'siren'"),
        (dict(dim=30, heads=4), "dim \\(30\\) must be divisible by heads \\(4\\)"),
        (dict(span={"enabled": True, "init": -0.3}), "span.init"),
        (dict(attention="favor", pe={"name": "siren"}), "relative encoder, which needs attention='relpos'"),
        (dict(attention="favor", pe={"name": "none"}, span={"enabled": True}), "span.enabled needs attention='relpos'"),
        (dict(attention="flash"), "attention must be one of"),
        (dict(pooling="first"), "pooling must be one of 'last', 'mean', 'max', 'cls'"),
        (dict(dimm=64), "unknown model config key 'dimm'; did you mean dim"),
        (dict(modeldim=64), "unknown model config key 'modeldim' \\(valid: in_channels, "),
        (dict(pe={"hiden_dim": 3}), "unknown model config key 'pe.hiden_dim'; did you mean pe.hidden_dim"),
        (dict(grid=[]), "grid must be a non-empty list"),
        (dict(dropout=1.5), "dropout must be in"),
        (dict(attention="clipped_relative", heads=1, dim=16, pe={"name": "none"}), "heads >= 2"),
        (dict(causal=True, attention="favor", pe={"name": "none"}), "causal=True needs attention in"),
        (dict(causal=True, pooling="cls"), "causal=True does not go with pooling='cls'"),
    ],
)
def test_bad_configs(values, match):
    with pytest.raises(ValueError, match=match):
        TransformerClassifier(**values)


def test_input_rank_and_channels_are_checked():
    model = TransformerClassifier(**SMALL)
    with pytest.raises(ValueError, match="2 grid axes and C = 1"):
        model(torch.rand(2, 20, 1))
    with pytest.raises(ValueError, match="2 grid axes and C = 1"):
        model(torch.rand(2, 5, 4, 3))


def test_config_round_trips_through_dicts():
    cfg = ModelConfig.from_dict({"dim": 32, "pe": {"name": "lookup", "max_distance": 3}, "span": {"enabled": True}})
    assert cfg.pe.max_distance == 3 and cfg.pe.hidden_dim == 64 and cfg.span.enabled
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.cuda
@pytest.mark.parametrize(
    "attention, pe",
    [
        ("relpos", "siren"),
        ("favor", "abs_learnable_sinusoid"),
        ("relative_favor", "none"),
        ("clipped_relative", "none"),
    ],
)
def test_classifier_on_cuda_matches_cpu(attention, pe):
    torch.manual_seed(0)
    kw = dict(SMALL, attention=attention, pe={"name": pe}, dropout=0.0, input_dropout=0.0)
    if attention == "relpos":
        kw["span"] = {"enabled": True}
    model = TransformerClassifier(**kw).double().eval()
    x = torch.rand(2, 5, 4, 1, dtype=torch.float64)
    expected = model(x)
    torch.testing.assert_close(model.cuda()(x.cuda()).cpu(), expected, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("grid, p", [([4, 6], 2), ([6, 3, 3], 3), ([8], 4)])
def test_patches_become_tokens(grid, p):
    torch.manual_seed(0)
    model = TransformerClassifier(grid=grid, patch_size=p, in_channels=2, dim=8, depth=1, heads=2, ffn_dim=8)
    assert model.config.token_grid == [n // p for n in grid]
    x = torch.randn(3, *grid, 2)
    tokens = model.patchify(x)
    assert tokens.shape == (3, *[n // p for n in grid], p ** len(grid) * 2)
    # token at patch index (1, 0, ...) holds the input block starting at (p, 0, ...)
    idx = tuple([1] + [0] * (len(grid) - 1))
    block = x[(slice(None), *[slice(i * p, (i + 1) * p) for i in idx])]
    torch.testing.assert_close(tokens[(slice(None), *idx)], block.reshape(3, -1))
    assert model(x).shape == (3, 10)
    assert model.blocks[0].attention.encoder(model.config.token_grid).shape[1] == math.prod(
        2 * n // p - 1 for n in grid
    )
    with pytest.raises(ValueError, match="patch_size"):
        TransformerClassifier(grid=grid, patch_size=5)


@pytest.mark.parametrize("attention, pe", [("relpos", "siren"), ("sdpa", "abs_sinusoidal"), ("relpos", "rope")])
def test_causal_models_read_only_earlier_tokens(attention, pe):
    """model.causal (the thesis' `causal`): a token's output ignores every later token."""
    torch.manual_seed(0)
    model = TransformerClassifier(
        grid=[3, 4],
        dim=16,
        heads=2,
        depth=2,
        dropout=0.0,
        input_dropout=0.0,
        attention=attention,
        pe={"name": pe},
        causal=True,
    ).eval()
    assert all(block.attention.causal for block in model.blocks)
    x = torch.randn(1, 12, 16)
    y = x.clone()
    y[:, 7:] += 1.0  # change the tokens after index 6
    shared = model.shared_encoder([3, 4]) if model.shared_encoder is not None else None
    for block in model.blocks:
        x, y = block(x, [3, 4], shared=shared), block(y, [3, 4], shared=shared)
    torch.testing.assert_close(x[:, :7], y[:, :7])
    assert (x[:, 7:] - y[:, 7:]).abs().max() > 1e-3
