"""Kernelizable (FAVOR+) attention and the translation-equivariant variants of
Horn et al., "Translational Equivariance in Kernelizable Attention" (2021,
arXiv:2102.07680).

FAVOR+ replaces ``exp(q . k / sqrt(D))`` by ``phi(q) . phi(k)`` with positive
orthogonal random features, so attention costs O(N m D) time and O(N m) memory
(no N x N matrix).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..grid import grid_coords
from .absolute import LearnableSinusoidEncoding
from .attention import MultiHeadSelfAttention, check_tokens, class_token_attention, split_heads

__all__ = [
    "orthogonal_gaussian",
    "favor_features",
    "linear_attention",
    "set_favor_kernel",
    "FavorAttention",
    "RelativeFavorAttention",
    "ClippedRelativeAttention",
    "ClippedWindowAttention",
    "clipped_relative_attention",
    "manhattan_window",
    "KERNELS",
]

KERNELS = ("favor", "softmax")


def orthogonal_gaussian(
    num_features: int, dim: int, *, dtype=torch.float32, device=None, generator=None
) -> torch.Tensor:
    """(num_features, dim) random features: stacked blocks of orthogonal rows (QR of
    Gaussian matrices), each row rescaled to the norm of a Gaussian vector so the
    rows are marginally N(0, I) (Choromanski et al., 'positive orthogonal random features')."""
    blocks = []
    for start in range(0, num_features, dim):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qmat, _ = torch.linalg.qr(g)
        blocks.append(qmat.T[: min(dim, num_features - start)])
    rows = torch.cat(blocks, dim=0)
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (rows * norms).to(dtype=dtype, device=device)


def favor_features(x: torch.Tensor, projection: torch.Tensor, is_query: bool, eps: float = 1e-4) -> torch.Tensor:
    """Positive random features of the softmax kernel: x (..., N, D), projection
    (m, D) -> (..., N, m) with ``E[phi(q) . phi(k)] ~ exp(q . k / sqrt(D))``.

    A max is subtracted for stability (per query row, or per (batch, head) for
    keys). Because of ``eps`` it does not cancel exactly in the attention's
    normalisation, so it is differentiated like the rest (as in the Performer
    code of Horn et al.): the gradient is the derivative of this forward.
    """
    x = x * x.shape[-1] ** -0.25
    wx = x @ projection.T
    sq = 0.5 * (x * x).sum(-1, keepdim=True)
    if is_query:
        stab = wx.amax(dim=-1, keepdim=True)
    else:
        stab = wx.amax(dim=(-1, -2), keepdim=True)
    return projection.shape[0] ** -0.5 * (torch.exp(wx - sq - stab) + eps)


def linear_attention(q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal kernelized attention: (B, H, N, m) features, v (B, H, N, Dv) ->
    ``phi(Q) (phi(K)^T V) / (phi(Q) phi(K)^T 1)``, O(N) memory."""
    kv = k_feat.transpose(-1, -2) @ v  # (B, H, m, Dv)
    norm = q_feat @ k_feat.sum(dim=-2).unsqueeze(-1)  # (B, H, N, 1)
    return (q_feat @ kv) / norm


class _FavorKernel(nn.Module):
    """Holds the random projection (a persistent buffer, saved in checkpoints)
    and redraws it every ``feature_redraw_interval`` training forwards."""

    def __init__(self, feature_dim: int, num_features: Optional[int], feature_redraw_interval: int, kernel: str):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if num_features is None:
            num_features = max(1, int(feature_dim * math.log(feature_dim)))
        if num_features < 1 or feature_redraw_interval < 0:
            raise ValueError(
                f"num_features must be >= 1 and feature_redraw_interval >= 0, got {num_features}, {feature_redraw_interval}"
            )
        self.kernel, self.feature_dim, self.num_features = kernel, feature_dim, num_features
        self.feature_redraw_interval = feature_redraw_interval
        self.register_buffer("projection", orthogonal_gaussian(num_features, feature_dim))
        self.register_buffer("calls_since_redraw", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def redraw(self) -> None:
        p = self.projection
        self.projection.copy_(orthogonal_gaussian(self.num_features, self.feature_dim, dtype=p.dtype, device=p.device))
        self.calls_since_redraw.zero_()

    def step_projection(self, dtype: torch.dtype) -> torch.Tensor:
        """The projection for this forward (redrawn first when a training forward is due)."""
        if self.training and self.feature_redraw_interval > 0:
            if int(self.calls_since_redraw) >= self.feature_redraw_interval:
                self.redraw()
            self.calls_since_redraw += 1
        return self.projection.to(dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kernel == "softmax":
            return F.scaled_dot_product_attention(q, k, v)
        proj = self.step_projection(q.dtype)
        return linear_attention(favor_features(q, proj, True), favor_features(k, proj, False), v)


def set_favor_kernel(module: nn.Module, kernel: str) -> int:
    """Switches every FAVOR+ attention in ``module`` to ``kernel`` (``"favor"`` or
    ``"softmax"``, the exact kernel); returns how many it switched."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    kernels = [m for m in module.modules() if isinstance(m, _FavorKernel)]
    for m in kernels:
        m.kernel = kernel
    return len(kernels)


class FavorAttention(MultiHeadSelfAttention):
    """Multi-head FAVOR+ self-attention (the Performer's), no positional term.

    Args:
        dim: model dimension.
        heads: attention heads (they divide ``dim``).
        num_features: random features m (default ``D log D``, D the head dim).
        feature_redraw_interval: redraw the features every this many training
            forwards (0: never).
        kernel: ``"favor"`` (random features) or ``"softmax"`` (exact attention,
            for checks).

    ``forward(x, grid, has_cls=False)``: x (B, T, dim); all T tokens attend to all.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        num_features: Optional[int] = None,
        feature_redraw_interval: int = 1000,
        kernel: str = "favor",
    ):
        super().__init__(dim, heads)
        self.attend = _FavorKernel(self._feature_dim(), num_features, feature_redraw_interval, kernel)

    def _feature_dim(self) -> int:
        return self.head_dim

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim)."""
        check_tokens(self, x, grid, has_cls, self.dim)
        return self.output(self.attend(*self.heads_qkv(x)))


class RelativeFavorAttention(FavorAttention):
    """Strategy 1 of Horn et al.: positional features appended to queries and keys,

        q_i = [W_q x_i ; p_i M_h],   k_j = [W_k x_j ; p_j],

    with p the sin/cos features of the coordinates (learnable frequencies, per
    axis) and M_h block diagonal with one 2x2 block [[a, b], [-b, a]] per head,
    axis and frequency, so ``(p_i M_h) . p_j = sum a cos(f (x_j - x_i)) + b sin(f (x_j - x_i))``
    depends only on the offset: with the softmax kernel the attention is exactly
    translation equivariant. The class token has zero positional features.

    Args (beyond FavorAttention's): ``ndim`` grid rank, ``num_frequencies`` F per
    axis, ``base``: the initial inverse frequencies are ``base ** (-i / F)``,
    i < F. Defaults as in the paper's code: F = 4, base = 2 x the longest axis
    (64 for its 32 x 32 images), a and b drawn from N(0, 1).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        ndim: int,
        num_frequencies: int = 4,
        num_features: Optional[int] = None,
        feature_redraw_interval: int = 1000,
        kernel: str = "favor",
        base: float = 64.0,
    ):
        if ndim < 1 or num_frequencies < 1 or not base > 1:
            raise ValueError(
                f"RelativeFavorAttention: ndim and num_frequencies must be >= 1 and base > 1, "
                f"got {ndim}, {num_frequencies}, {base}"
            )
        self.ndim, self.num_frequencies = ndim, num_frequencies
        super().__init__(dim, heads, num_features, feature_redraw_interval, kernel)
        self.positions = LearnableSinusoidEncoding(2 * ndim * num_frequencies, ndim, base=base)
        self.rot_a = nn.Parameter(torch.randn(heads, ndim, num_frequencies))
        self.rot_b = nn.Parameter(torch.randn(heads, ndim, num_frequencies))

    def _feature_dim(self) -> int:
        return self.head_dim + 2 * self.ndim * self.num_frequencies

    def positional_features(self, grid: Sequence[int], device=None, dtype=torch.float32):
        """(H, N, P) query features ``p_i M_h`` and (N, P) key features ``p_j``, P = 2 G F."""
        theta = self.positions.angles(grid, device, dtype)  # (N, G, F)
        cos, sin = torch.cos(theta), torch.sin(theta)
        a, b = self.rot_a.to(dtype)[:, None], self.rot_b.to(dtype)[:, None]  # (H, 1, G, F)
        q_pos = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(2)
        k_pos = torch.cat([cos, sin], dim=-1).flatten(1)
        return q_pos, k_pos

    def queries_keys_values(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False):
        """(B, H, T, D + P) queries ``[q ; p M]``, keys ``[k ; p]`` and (B, H, T, D) values."""
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        B = x.shape[0]
        q, k, v = self.heads_qkv(x)
        q_pos, k_pos = self.positional_features(grid, x.device, x.dtype)
        q_pos = q_pos.expand(B, -1, -1, -1)
        k_pos = k_pos.expand(B, self.heads, -1, -1)
        if has_cls:
            q_pos, k_pos = F.pad(q_pos, (0, 0, 1, 0)), F.pad(k_pos, (0, 0, 1, 0))
        return torch.cat([q, q_pos], dim=-1), torch.cat([k, k_pos], dim=-1), v

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim)."""
        return self.output(self.attend(*self.queries_keys_values(x, grid, has_cls)))


def manhattan_window(ndim: int, clip: int) -> list[tuple[int, ...]]:
    """The offsets of Manhattan length < ``clip`` in ``ndim`` dimensions (the
    keys strategy 2 scores with their own row; all others take the far row)."""
    span = range(-(clip - 1), clip)
    return [o for o in itertools.product(span, repeat=ndim) if sum(abs(d) for d in o) < clip]


def clipped_relative_attention(
    scores: torch.Tensor, v: torch.Tensor, grid: Sequence[int], has_cls: bool = False
) -> torch.Tensor:
    """The relative heads of strategy 2 in O(N) memory.

    Args:
        scores: (B, H, T, c + 1) positive scores ``s[i, d]`` of query i against
            table row d (``phi(q_i) . phi(r_d)``); row c is the far row.
        v: (B, H, T, Dv) values; T = prod(grid) (+1: a class token at index 0).
        grid: the token grid.
        has_cls: the class token is outside the grid: scored with the far row
            from and by every token.

    Returns ``out_i = sum_j s[i, d_ij] v_j / sum_j s[i, d_ij]`` (B, H, T, Dv), with
    ``d_ij = min(|pos_j - pos_i|_1, c)``. The far keys of a query are all keys
    but its window (offsets |o|_1 < c inside the grid): the far term is
    ``s[i, c] (sum_j v_j - window sum)`` over ``T - window size`` keys, and each
    window offset adds its own score times its shifted values. Only positive
    terms enter the denominator, so a window that holds every key leaves no
    cancellation. No (N, N) and no (N, W, Dv) tensor; autograd keeps one
    (B, H, N) weight per offset.
    """
    c = scores.shape[-1] - 1
    B, H, T, Dv = v.shape
    grid = [int(n) for n in grid]
    start = int(has_cls)
    far = scores[..., c]
    v_sum = v.sum(dim=-2, keepdim=True)
    if c == 0:
        return v_sum.expand_as(v) / T  # every key takes the one row
    sg = scores[:, :, start:, :c].reshape(B, H, *grid, c)
    vg = v[:, :, start:].reshape(B, H, *grid, Dv)
    pad = c - 1
    vpad = F.pad(vg, (0, 0) + (pad, pad) * len(grid))  # zero values outside the grid
    cells = [torch.arange(n, device=v.device) for n in grid]
    num = den = v_win = None
    count = torch.zeros(grid, dtype=v.dtype, device=v.device)  # window keys inside the grid, per query
    for off in manhattan_window(len(grid), c):
        if any(abs(o) >= n for o, n in zip(off, grid)):
            continue  # the whole offset lies outside the grid
        inside = torch.ones((), dtype=v.dtype, device=v.device)
        for axis, (o, idx) in enumerate(zip(off, cells)):
            ok = ((idx + o >= 0) & (idx + o < grid[axis])).to(v.dtype)
            inside = inside * ok.view([-1] + [1] * (len(grid) - 1 - axis))
        count = count + inside
        w = sg[..., sum(abs(o) for o in off)] * inside  # (B, H, *grid)
        shifted = vpad[(slice(None), slice(None)) + tuple(slice(pad + o, pad + o + n) for o, n in zip(off, grid))]
        term = w.unsqueeze(-1) * shifted
        num = term if num is None else num + term
        den = w if den is None else den + w
        v_win = shifted if v_win is None else v_win + shifted
    far_g = far[:, :, start:].reshape(B, H, *grid)
    n_far = T - count  # exact small integers; 0 where the window holds every key
    has_far = (n_far > 0).to(v.dtype).unsqueeze(-1)
    v_far = (v_sum.reshape(B, H, *[1] * len(grid), Dv) - v_win) * has_far  # exactly 0 without far keys
    num = (num + far_g.unsqueeze(-1) * v_far).reshape(B, H, -1, Dv)
    den = (den + far_g * n_far).reshape(B, H, -1)
    if has_cls:  # the class token's query: every key is far
        num = torch.cat([far[:, :, :1, None] * v_sum, num], dim=2)
        den = torch.cat([far[:, :, :1] * T, den], dim=2)
    return num / den.unsqueeze(-1)


class _ClippedAttention(MultiHeadSelfAttention):
    """What the two clipped-relative attentions share: half the heads relative with
    offsets clipped at ``clip`` on an ``ndim``-axis grid, FAVOR+ features for the rest."""

    min_heads = 2  # at least one relative head and one other

    def __init__(
        self,
        dim: int,
        heads: int,
        ndim: int,
        clip: int = 4,
        num_features: Optional[int] = None,
        feature_redraw_interval: int = 1000,
        kernel: str = "favor",
    ):
        if clip < 1 or ndim < 1:
            raise ValueError(f"{type(self).__name__}: clip and ndim must be >= 1, got {clip}, {ndim}")
        super().__init__(dim, heads)
        self.ndim, self.clip = ndim, clip
        self._favor_args = (num_features, feature_redraw_interval, kernel)
        self.attend = self.favor_kernel()

    def favor_kernel(self) -> "_FavorKernel":
        """A FAVOR+ (or softmax) kernel with the constructor's feature settings."""
        return _FavorKernel(self.head_dim, *self._favor_args)


class ClippedRelativeAttention(_ClippedAttention):
    """Strategy 2 of Horn et al. as in the paper's code: the first ``heads // 2``
    heads are FAVOR+ attention over content; the other heads score key j for
    query i by position alone,

        score_ij = phi(q_i) . phi(r[min(|pos_j - pos_i|_1, clip)]),
        out_i = sum_j score_ij v_j / sum_j score_ij,

    with one learned table r of ``clip + 1`` rows (zero at start, shared by the
    relative heads, so they start as uniform averages), every key at Manhattan
    distance >= clip taking the far row r[clip], and phi the FAVOR+ features
    (their own random projection; ``kernel="softmax"``: ``exp(q . r / sqrt(D))``
    exactly). Keys have no content projection in the relative heads.

    Time O(N (m + W) D) and memory O(N (m + D + W)) with W < (2 clip - 1)^G window
    offsets (:func:`clipped_relative_attention`). The class token is outside
    the grid: far from every token. (The paper's code appends it as an extra
    pixel below the image's bottom-left corner, an artefact of its index
    arithmetic; and it never redraws the relative heads' features, which
    posattn redraws with the content heads'.)

    ``forward(x, grid, has_cls=False)``: x (B, T, dim).
    """

    def __init__(self, dim: int, heads: int, ndim: int, clip: int = 4, **favor):
        """``favor``: num_features, feature_redraw_interval, kernel (see :class:`FavorAttention`)."""
        super().__init__(dim, heads, ndim, clip, **favor)
        self.content_heads = heads // 2  # at least one content and one relative head
        self.rel_heads = heads - self.content_heads
        # q and v for every head, k for the content heads only
        self.qkv = nn.Linear(dim, 2 * dim + self.content_heads * self.head_dim)
        self.rel = nn.Parameter(torch.zeros(clip + 1, self.head_dim))
        self.attend_rel = self.favor_kernel()

    def heads_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, dim) -> q, v (B, H, T, D) and the content heads' k (B, H // 2, T, D)."""
        q, v, k = self.qkv(x).split([self.dim, self.dim, self.content_heads * self.head_dim], dim=-1)
        return split_heads(q, self.heads), split_heads(k, self.content_heads), split_heads(v, self.heads)

    def relative_scores(self, q: torch.Tensor) -> torch.Tensor:
        """(B, Hr, T, D) queries of the relative heads -> (B, Hr, T, clip + 1) positive scores."""
        r = self.rel.to(q.dtype)
        if self.attend_rel.kernel == "softmax":
            logits = q @ r.T * self.head_dim**-0.5
            return torch.exp(logits - logits.amax(dim=-1, keepdim=True))  # the shift cancels in the ratio
        proj = self.attend_rel.step_projection(q.dtype)
        return favor_features(q, proj, True) @ favor_features(r, proj, False).T

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim)."""
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        if len(grid) != self.ndim:
            raise ValueError(f"ClippedRelativeAttention was built for {self.ndim}-D grids, got grid {grid}")
        q, k, v = self.heads_qkv(x)
        hc = self.content_heads
        out_content = self.attend(q[:, :hc], k, v[:, :hc])
        out_rel = clipped_relative_attention(self.relative_scores(q[:, hc:]), v[:, hc:], grid, has_cls)
        return self.output(torch.cat([out_content, out_rel], dim=1))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.heads} ({self.rel_heads} relative), clip={self.clip}"


class ClippedWindowAttention(_ClippedAttention):
    """A local-window variant of strategy 2 (posattn's earlier reading of it, kept as
    ``performer.clipped_form: window``; the paper's model is :class:`ClippedRelativeAttention`): half the heads (``heads // 2``) use learned
    relative embeddings by Manhattan distance, clipped at ``clip``, over the
    window ``|delta_d| <= clip - 1`` ((2 clip - 1)^G keys); the other heads are
    FAVOR+ without positions. For a relative head (Shaw et al.'s form)::

        logit_ij = (q_i . (k_j + r[min(|pos_j - pos_i|_1, clip)])) / sqrt(D),  j in window(i)

    The window is gathered (memory O(N (2 clip - 1)^G D), linear in N). The class
    token attends content-only to all tokens in the relative heads.
    """

    def __init__(self, dim: int, heads: int, ndim: int, clip: int = 4, **favor):
        """``favor``: num_features, feature_redraw_interval, kernel (see :class:`FavorAttention`)."""
        super().__init__(dim, heads, ndim, clip, **favor)
        self.rel_heads = heads // 2  # at least one relative and one FAVOR+ head
        self.rel = nn.Parameter(torch.randn(self.rel_heads, clip + 1, self.head_dim) * 0.02)

    def window(self, grid: Sequence[int], device=None):
        """Neighbour indices (N, W), validity (N, W) and Manhattan rows (W,) of the window."""
        c = self.clip
        offsets = grid_coords([2 * c - 1] * len(grid), device=device) - (c - 1)  # (W, G)
        coords = grid_coords(grid, device=device)  # (N, G)
        nb = coords[:, None, :] + offsets[None]  # (N, W, G)
        sizes = torch.tensor(grid, device=device)
        valid = ((nb >= 0) & (nb < sizes)).all(-1)
        nb = torch.minimum(nb.clamp(min=0), sizes - 1)
        index = torch.zeros(nb.shape[:2], dtype=torch.long, device=device)
        for d, n in enumerate(grid):
            index = index * n + nb[..., d]
        dist = offsets.abs().sum(-1).clamp(max=c)
        return index, valid, dist

    def forward(self, x: torch.Tensor, grid: Sequence[int], has_cls: bool = False, shared=None) -> torch.Tensor:
        """x (B, T, dim), T = prod(grid) (+1 with a class token) -> (B, T, dim)."""
        grid = check_tokens(self, x, grid, has_cls, self.dim)
        if len(grid) != self.ndim:
            raise ValueError(f"ClippedWindowAttention was built for {self.ndim}-D grids, got grid {grid}")
        q, k, v = self.heads_qkv(x)
        hr, start = self.rel_heads, int(has_cls)
        out_favor = self.attend(q[:, hr:], k[:, hr:], v[:, hr:])

        qr, kr, vr = q[:, :hr, start:], k[:, :hr, start:], v[:, :hr, start:]  # (B, Hr, N, D)
        index, valid, dist = self.window(grid, x.device)
        k_nb, v_nb = kr[:, :, index], vr[:, :, index]  # (B, Hr, N, W, D)
        r = self.rel.to(x.dtype)[:, dist]  # (Hr, W, D)
        logits = (qr.unsqueeze(-2) * (k_nb + r[None, :, None])).sum(-1) * self.head_dim**-0.5
        weights = logits.masked_fill(~valid, float("-inf")).softmax(dim=-1)
        out_rel = (weights.unsqueeze(-1) * v_nb).sum(-2)
        if has_cls:
            cls = class_token_attention(q[:, :hr, :1], k[:, :hr], v[:, :hr])
            out_rel = torch.cat([cls, out_rel], dim=2)
        return self.output(torch.cat([out_rel, out_favor], dim=1))
