"""The variable-resolution data of the packed experiment (issue 62): random sizes, patches, packing."""

import pytest
import torch

from posattn.training.varres import pack_batches, random_resolution


def test_random_resolution_and_packing():
    g = torch.Generator().manual_seed(0)
    images = torch.rand(20, 28, 28, 1, generator=g)
    samples = random_resolution(images, (12, 28), 4, g)
    assert len(samples) == 20
    shapes = {grid for _, grid in samples}
    assert len(shapes) > 3  # sizes and aspect ratios vary
    for tokens, (h, w) in samples:
        assert 3 <= h <= 7 and 3 <= w <= 7 and tokens.shape == (h * w, 16)
    batches = pack_batches(samples, 64)
    assert sorted(i for b in batches for i in b.index) == list(range(20))
    for b in batches:
        assert b.tokens.shape == (1, 64, 16) and b.grids.num_tokens <= 64
        assert (b.tokens[0, b.grids.num_tokens :] == 0).all()
        for (start, grid), i in zip(b.grids.samples(), b.index):
            assert grid == samples[i][1]
            assert torch.equal(b.tokens[0, start : start + grid[0] * grid[1]], samples[i][0])


def test_random_resolution_bad_sides():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="sides must satisfy"):
        random_resolution(torch.rand(2, 8, 8, 1), (2, 8), 4, g)
