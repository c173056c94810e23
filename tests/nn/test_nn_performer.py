"""FAVOR+ attention and the Performer family of Horn et al."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.nn import LargestTensor

from posattn.nn import (
    ClippedRelativeAttention,
    ClippedRelativePerformer,
    ClippedWindowAttention,
    FavorAttention,
    NoPosPerformer,
    Performer,
    RelativeFavorAttention,
    RelativePerformer,
)
from posattn.nn.attention import split_heads
from posattn.nn.favor import (
    clipped_relative_attention,
    favor_features,
    linear_attention,
    manhattan_window,
    orthogonal_gaussian,
)


def test_orthogonal_gaussian_blocks_are_orthogonal():
    torch.manual_seed(0)
    w = orthogonal_gaussian(20, 8, dtype=torch.float64)
    assert w.shape == (20, 8)
    for start in (0, 8):
        block = w[start : start + 8]
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-10
    norms = w.norm(dim=1)
    assert (norms > 0.5).all() and not torch.allclose(norms, norms[0].expand(20))


def test_linear_attention_is_normalised_kernel_attention():
    torch.manual_seed(0)
    qf, kf = torch.rand(2, 3, 9, 5, dtype=torch.float64) + 0.1, torch.rand(2, 3, 9, 5, dtype=torch.float64) + 0.1
    v = torch.randn(2, 3, 9, 4, dtype=torch.float64)
    a = qf @ kf.transpose(-1, -2)
    torch.testing.assert_close(linear_attention(qf, kf, v), (a / a.sum(-1, keepdim=True)) @ v)


def test_favor_approximates_softmax_attention_better_with_more_features():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 64, 16, dtype=torch.float64) * 0.5, torch.randn(1, 2, 64, 16, dtype=torch.float64) * 0.5
    v = torch.randn(1, 2, 64, 16, dtype=torch.float64)
    exact = F.scaled_dot_product_attention(q, k, v)
    errors = []
    for m in (16, 256, 4096):
        proj = orthogonal_gaussian(m, 16, dtype=torch.float64)
        approx = linear_attention(favor_features(q, proj, True), favor_features(k, proj, False), v)
        errors.append((approx - exact).norm() / exact.norm())
    assert errors[2] < 0.05 and errors[2] < errors[1] < errors[0]
    assert (favor_features(q, proj, True) > 0).all()


@pytest.mark.parametrize("N", [9, 14])
def test_favor_gradient_is_the_derivative_of_the_forward(N):
    """Finite differences of the FAVOR+ forward (stabilisers included) against autograd, float64."""
    torch.manual_seed(N)
    q, k, v = (torch.randn(2, 2, N, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    proj = orthogonal_gaussian(12, 8, dtype=torch.float64)

    def attend(q, k, v):
        return linear_attention(favor_features(q, proj, True), favor_features(k, proj, False), v)

    assert torch.autograd.gradcheck(attend, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_feature_redraw_interval_and_checkpoint():
    torch.manual_seed(0)
    attn = FavorAttention(16, 2, num_features=12, feature_redraw_interval=3)
    x = torch.randn(2, 10, 16)
    p0 = attn.attend.projection.clone()
    for _ in range(3):
        attn(x, [10])
    assert torch.equal(attn.attend.projection, p0)
    attn(x, [10])  # the 4th training forward redraws
    assert not torch.equal(attn.attend.projection, p0)
    attn.eval()
    p1 = attn.attend.projection.clone()
    for _ in range(5):
        attn(x, [10])
    assert torch.equal(attn.attend.projection, p1)  # never in eval
    state = attn.state_dict()
    assert "attend.projection" in state and "attend.calls_since_redraw" in state
    other = FavorAttention(16, 2, num_features=12, feature_redraw_interval=3)
    other.load_state_dict(state)
    other.eval()
    torch.testing.assert_close(other(x, [10]), attn(x, [10]))


@pytest.mark.parametrize("grid", [[5, 6], [7], [2, 3, 2]])
def test_relative_favor_positional_dot_product_depends_only_on_offset(grid):
    torch.manual_seed(0)
    attn = RelativeFavorAttention(16, 2, len(grid), num_frequencies=4).double()
    q_pos, k_pos = attn.positional_features(grid, dtype=torch.float64)
    N = math.prod(grid)
    dots = (q_pos @ k_pos.T).view(2, *grid, *grid)  # (H, *grid_i, *grid_j)
    G = len(grid)
    shift = [min(1, n - 1) for n in grid]
    lo = tuple(slice(0, n - s) for n, s in zip(grid, shift))
    hi = tuple(slice(s, n) for n, s in zip(grid, shift))
    torch.testing.assert_close(dots[(slice(None), *lo, *lo)], dots[(slice(None), *hi, *hi)], rtol=1e-10, atol=1e-10)
    # the closed form: sum over axes and frequencies of a cos(f delta) + b sin(f delta)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(N, G).double()
    f = attn.positions.inv_freq.double()
    i, j = 0, N - 1
    theta = (coords[j] - coords[i])[:, None] * f  # (G, F)
    expected = (attn.rot_a.double() * torch.cos(theta) + attn.rot_b.double() * torch.sin(theta)).sum((-1, -2))
    torch.testing.assert_close(dots.view(2, N, N)[:, i, j], expected)


def test_relative_favor_logits_are_translation_equivariant():
    """Translate the content: the softmax-kernel logit of every translated pair
    equals the original pair's (content and offset are unchanged)."""
    torch.manual_seed(0)
    attn = RelativeFavorAttention(16, 2, 2, num_frequencies=4).double()
    x = torch.randn(1, 6, 9, 16, dtype=torch.float64)
    shifted = torch.roll(x, shifts=(1, 3), dims=(1, 2))
    q, k, _ = attn.queries_keys_values(x.reshape(1, 54, 16), [6, 9])
    qs, ks, _ = attn.queries_keys_values(shifted.reshape(1, 54, 16), [6, 9])
    logits = (q @ k.transpose(-1, -2)).view(2, 6, 9, 6, 9)
    logits_s = (qs @ ks.transpose(-1, -2)).view(2, 6, 9, 6, 9)
    torch.testing.assert_close(logits_s[:, 1:, 3:, 1:, 3:], logits[:, :5, :6, :5, :6], rtol=1e-10, atol=1e-10)
    # control: the absolute-encoding Performer's logits are not equivariant
    attn_abs = FavorAttention(16, 2).double()
    from posattn.nn import LearnableSinusoidEncoding

    enc = LearnableSinusoidEncoding(16, 2).double()
    qa, ka, _ = (split_heads(t, 2) for t in attn_abs.qkv(enc(x.reshape(1, 54, 16), [6, 9])).chunk(3, -1))
    qa_s, ka_s, _ = (split_heads(t, 2) for t in attn_abs.qkv(enc(shifted.reshape(1, 54, 16), [6, 9])).chunk(3, -1))
    la = (qa @ ka.transpose(-1, -2)).view(2, 6, 9, 6, 9)
    la_s = (qa_s @ ka_s.transpose(-1, -2)).view(2, 6, 9, 6, 9)
    assert not torch.allclose(la_s[:, 1:, 3:, 1:, 3:], la[:, :5, :6, :5, :6])


def dense_window_reference(attn, x, grid):
    """The relative heads of ClippedWindowAttention computed with N x N matrices."""
    hr = attn.rel_heads
    q, k, v = (split_heads(t, attn.heads)[:, :hr] for t in attn.qkv(x).chunk(3, dim=-1))
    N = math.prod(grid)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(N, -1)
    delta = coords[None] - coords[:, None]
    inside = (delta.abs() <= attn.clip - 1).all(-1)
    dist = delta.abs().sum(-1).clamp(max=attn.clip)
    r = attn.rel[:, dist]  # (Hr, N, N, D)
    logits = (torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,hijd->bhij", q, r)) / math.sqrt(attn.head_dim)
    return logits.masked_fill(~inside, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("grid", [[9], [5, 6], [3, 1, 4]])
def test_clipped_window_heads_match_dense_reference(grid):
    torch.manual_seed(0)
    attn = ClippedWindowAttention(16, 4, len(grid), clip=2).double()
    with torch.no_grad():
        attn.rel.normal_()
    x = torch.randn(2, math.prod(grid), 16, dtype=torch.float64)
    captured = {}
    attn.proj.register_forward_hook(lambda m, inp, out: captured.setdefault("merged", inp[0]))
    attn(x, grid)
    rel_part = captured["merged"].view(2, -1, 4, 4)[:, :, :2].transpose(1, 2)
    torch.testing.assert_close(rel_part, dense_window_reference(attn, x, grid), rtol=1e-10, atol=1e-10)


def test_clipped_window_gradients_and_class_token():
    torch.manual_seed(0)
    attn = ClippedWindowAttention(16, 4, 2, clip=3)
    x = torch.randn(2, 1 + 20, 16, requires_grad=True)
    attn(x, [4, 5], has_cls=True).square().sum().backward()
    assert attn.rel.grad.abs().max() > 0 and x.grad[:, 0].abs().max() > 0


def paper_clipped_dense(attn, x, grid, has_cls):
    """Strategy 2 of Horn et al. with (T, T) matrices, float64: the relative heads score
    key j for query i with phi(q_i) . phi(r[min(|pos_j - pos_i|_1, c)]) (the class token,
    outside the grid, with the far row r[c]) and normalise the scores."""
    hc, c, D = attn.content_heads, attn.clip, attn.head_dim
    q, v, _ = attn.qkv(x).split([attn.dim, attn.dim, hc * D], dim=-1)
    q, v = split_heads(q, attn.heads)[:, hc:], split_heads(v, attn.heads)[:, hc:]
    N = math.prod(grid)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(N, -1)
    dist = (coords[None] - coords[:, None]).abs().sum(-1).clamp(max=c)
    if has_cls:
        dist = F.pad(dist, (1, 0, 1, 0), value=c)
    if attn.attend_rel.kernel == "softmax":
        table = q @ attn.rel.T / math.sqrt(D)  # (B, Hr, T, c + 1) logits
        logits = table.gather(-1, dist.expand(*table.shape[:2], -1, -1))
        return logits.softmax(-1) @ v
    proj = attn.attend_rel.projection
    table = favor_features(q, proj, True) @ favor_features(attn.rel, proj, False).T
    scores = table.gather(-1, dist.expand(*table.shape[:2], -1, -1))
    return scores / scores.sum(-1, keepdim=True) @ v


def clipped_rel_part(attn, x, grid, has_cls):
    """The relative heads' output of ClippedRelativeAttention (before the output projection)."""
    captured = {}
    handle = attn.proj.register_forward_hook(lambda m, inp, out: captured.setdefault("merged", inp[0]))
    attn(x, grid, has_cls=has_cls)
    handle.remove()
    B, T, _ = x.shape
    return captured["merged"].view(B, T, attn.heads, attn.head_dim)[:, :, attn.content_heads :].transpose(1, 2)


@pytest.mark.parametrize("kernel", ["favor", "softmax"])
@pytest.mark.parametrize(
    "grid,clip,heads,has_cls",
    [
        ([13], 4, 4, False),
        ([5, 7], 4, 4, True),
        ([9, 1], 3, 3, False),
        ([1, 6], 2, 5, True),
        ([3, 1, 4], 2, 4, True),
        ([4, 5, 3], 3, 2, False),
        ([6, 6], 1, 2, True),
        ([7], 9, 2, False),
    ],
)
def test_clipped_relative_matches_dense_paper_formula(kernel, grid, clip, heads, has_cls):
    """The O(N) strategy 2 against the paper's formula with (T, T) scores, float64, forward and gradients:
    1-D/2-D/3-D, odd sizes, size-1 axes, windows larger and smaller than the grid, odd head counts."""
    torch.manual_seed(len(grid) * 10 + clip)
    attn = ClippedRelativeAttention(6 * heads, heads, len(grid), clip=clip, kernel=kernel).double()
    with torch.no_grad():
        attn.rel.normal_()  # the paper starts from zeros: every key alike
    T = math.prod(grid) + int(has_cls)
    x = torch.randn(2, T, 6 * heads, dtype=torch.float64, requires_grad=True)
    ours, dense = clipped_rel_part(attn, x, grid, has_cls), paper_clipped_dense(attn, x, grid, has_cls)
    torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-12)
    w = torch.randn_like(dense)
    g_ours = torch.autograd.grad((ours * w).sum(), [x, attn.rel])
    g_dense = torch.autograd.grad((dense * w).sum(), [x, attn.rel])
    for a, b in zip(g_ours, g_dense):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_clipped_relative_attention_gradcheck():
    torch.manual_seed(0)
    scores = (torch.rand(1, 2, 1 + 12, 4, dtype=torch.float64) + 0.1).requires_grad_()
    v = torch.randn(1, 2, 1 + 12, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, v: clipped_relative_attention(s, v, [3, 4], has_cls=True), (scores, v))


@pytest.mark.parametrize("grid,has_cls", [([3], False), ([2, 3], False), ([3, 3], True)])
def test_clipped_relative_attention_float32_window_holding_every_key(grid, has_cls):
    """Far scores 1e9 times the window's: no cancellation in float32 where the window holds every
    key (no far key is left), and the far keys dominate where some are."""
    torch.manual_seed(0)
    T = math.prod(grid) + int(has_cls)
    scores = torch.rand(1, 2, T, 5, dtype=torch.float64) * 1e-9 + 1e-9
    scores[..., 4] = 1.0
    v = torch.randn(1, 2, T, 3, dtype=torch.float64)
    N = math.prod(grid)
    coords = torch.stack(torch.meshgrid(*[torch.arange(n) for n in grid], indexing="ij"), -1).reshape(N, -1)
    dist = (coords[None] - coords[:, None]).abs().sum(-1).clamp(max=4)
    if has_cls:
        dist = F.pad(dist, (1, 0, 1, 0), value=4)
    dense = scores.gather(-1, dist.expand(1, 2, -1, -1))
    expected = dense / dense.sum(-1, keepdim=True) @ v
    ours = clipped_relative_attention(scores.float(), v.float(), grid, has_cls)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours.double(), expected, rtol=1e-4, atol=1e-5)


def test_clipped_relative_module_matches_dense_model_of_both_head_groups():
    """The whole module (content and relative heads, output projection) against a dense float64 model,
    exact softmax kernel, odd head count."""
    torch.manual_seed(3)
    grid, heads, dim = [4, 5], 5, 30
    attn = ClippedRelativeAttention(dim, heads, 2, clip=3, kernel="softmax").double()
    with torch.no_grad():
        attn.rel.normal_()
    x = torch.randn(2, 1 + 20, dim, dtype=torch.float64)
    hc, D = attn.content_heads, attn.head_dim
    q, v, k = attn.qkv(x).split([dim, dim, hc * D], dim=-1)
    q, v, k = split_heads(q, heads), split_heads(v, heads), split_heads(k, hc)
    content = ((q[:, :hc] @ k.transpose(-1, -2)) / math.sqrt(D)).softmax(-1) @ v[:, :hc]
    rel = paper_clipped_dense(attn, x, grid, True)
    out = torch.cat([content, rel], dim=1).transpose(1, 2).reshape(2, 21, dim)
    torch.testing.assert_close(attn(x, grid, has_cls=True), attn.proj(out), rtol=1e-10, atol=1e-12)


def test_manhattan_window_counts():
    assert len(manhattan_window(2, 4)) == 25  # the paper's c = 4 diamond
    assert len(manhattan_window(1, 4)) == 7 and len(manhattan_window(3, 2)) == 7 and manhattan_window(2, 1) == [(0, 0)]


def test_clipped_relative_is_the_papers_parametrisation():
    attn = ClippedRelativeAttention(40, 5, 2, clip=4)
    assert attn.content_heads == 2 and attn.rel_heads == 3  # heads // 2 content heads, as the paper's code
    assert attn.rel.shape == (5, 8) and attn.rel.abs().max() == 0  # one zero table shared by the relative heads
    assert attn.qkv.out_features == 2 * 40 + 2 * 8  # no key projection for the relative heads
    with torch.no_grad():  # a zero table: the relative heads average all values
        x = torch.randn(2, 1 + 12, 40)
        out = clipped_rel_part(attn, x, [3, 4], True)
        v = split_heads(attn.qkv(x)[..., 40:80], 5)[:, 2:]
        torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand_as(out), rtol=1e-5, atol=1e-6)


def test_clipped_relative_gradients_and_class_token():
    torch.manual_seed(0)
    attn = ClippedRelativeAttention(16, 4, 2, clip=3)
    x = torch.randn(2, 1 + 20, 16, requires_grad=True)
    attn(x, [4, 5], has_cls=True).square().sum().backward()
    assert attn.rel.grad.abs().max() > 0 and x.grad[:, 0].abs().max() > 0
    with pytest.raises(ValueError, match="built for 2-D grids"):
        attn(torch.randn(1, 20, 16), [20])


@pytest.mark.parametrize("module", ["favor", "relative_favor", "clipped_relative"])
def test_favor_attentions_keep_memory_linear_in_n(module):
    torch.manual_seed(0)
    grid = [48, 48]
    N = 48 * 48
    attn = {
        "favor": lambda: FavorAttention(16, 2),
        "relative_favor": lambda: RelativeFavorAttention(16, 2, 2, num_frequencies=4),
        "clipped_relative": lambda: ClippedRelativeAttention(16, 2, 2, clip=4),
    }[module]()
    x = torch.randn(1, N, 16, requires_grad=True)
    with LargestTensor() as mode:
        attn(x, grid).sum().backward()
    m = attn.attend.num_features
    assert mode.numel <= N * max(3 * 16, 2 * m) < N * N // 8, mode.numel  # qkv or features: linear in N


@pytest.mark.parametrize("model", [Performer, NoPosPerformer, RelativePerformer, ClippedRelativePerformer])
def test_performer_models_train_step(model):
    torch.manual_seed(0)
    m = model(in_channels=1, num_classes=10, grid=(6, 6), dim=32, depth=2, heads=4, ffn_dim=64)
    x = torch.randn(3, 6, 6, 1)
    loss = F.cross_entropy(m(x), torch.tensor([1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)


def test_performer_parameter_count_matches_the_paper():
    # The published model summary (dim 128, depth 4, heads 4, MNIST) lists 794 K parameters.
    m = Performer(in_channels=1, num_classes=10, grid=(28, 28))
    assert 0.790e6 < m.num_parameters() < 0.800e6
