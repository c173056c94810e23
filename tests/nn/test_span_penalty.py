"""span.penalty: the adaptive-span term that narrows learned spans."""

import pytest
import torch

from posattn.nn import ModelConfig, TransformerClassifier


def model(penalty, learnable=True, enabled=True):
    cfg = ModelConfig.from_dict(
        dict(
            grid=[6, 6],
            in_channels=1,
            num_classes=3,
            dim=16,
            depth=2,
            heads=2,
            ffn_dim=16,
            pe=dict(name="lookup"),
            span=dict(enabled=enabled, threshold=0.1, penalty=penalty, learnable=learnable),
        )
    )
    torch.manual_seed(0)
    return TransformerClassifier(cfg)


def test_penalty_is_the_weighted_mean_sigma():
    m = model(0.5)
    expected = 0.5 * torch.stack([s.sigma().mean() for s in m.spans()]).mean()
    torch.testing.assert_close(m.span_penalty(), expected)
    assert model(0.0).span_penalty() is None
    assert model(0.5, learnable=False).span_penalty() is None
    assert model(0.5, enabled=False).span_penalty() is None


def test_penalty_narrows_the_spans():
    sigmas = {}
    for penalty in (0.0, 5.0):
        m = model(penalty)
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(16, 6, 6, 1, generator=g), torch.randint(0, 3, (16,), generator=g)
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            if m.span_penalty() is not None:
                loss = loss + m.span_penalty()
            loss.backward()
            opt.step()
        sigmas[penalty] = torch.stack([s.sigma().mean() for s in m.spans()]).mean().item()
    assert sigmas[5.0] < sigmas[0.0] - 0.01  # Adam moves raw sigma ~lr per step either way


@pytest.mark.parametrize("value", [-0.1, float("inf"), "0.1", True])
def test_penalty_must_be_a_finite_number_at_least_zero(value):
    with pytest.raises(ValueError, match="span.penalty must be"):
        model(value)
