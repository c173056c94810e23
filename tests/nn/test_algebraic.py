"""Algebraic (orthogonal-power) encodings: maps, defining properties, modules."""

import math

import pytest
import torch
from helpers import ROOT

from posattn import ops
from posattn.algebraic import (
    orthogonal,
    power_table,
    rope_angles,
    rope_generator_init,
    rope_rotation,
    tree_maps_heap,
    tree_maps_parents,
)
from posattn.nn import TransformerClassifier
from posattn.nn.algebraic import AlgebraicEncoder, AlgebraicSelfAttention


def random_orthogonal(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return orthogonal(torch.randn(*shape, generator=g, dtype=torch.float64))


def test_orthogonal_and_power_table():
    w = random_orthogonal(3, 5, 5)
    eye = torch.eye(5, dtype=torch.float64)
    torch.testing.assert_close(w @ w.transpose(-1, -2), eye.expand(3, 5, 5))
    for P in (1, 2, 7, 16, 17):
        table = power_table(w, P)
        assert table.shape == (P, 3, 5, 5)
        for p in {0, P // 2, P - 1}:
            torch.testing.assert_close(table[p], torch.linalg.matrix_power(w, p))


def test_sequence_scores_depend_on_the_offset():
    """(W^p q) . (W^r k) == q^T W^(r - p) k, through apply_maps."""
    H, N, m = 2, 9, 6
    w = random_orthogonal(H, 1, m, m)
    maps = power_table(w, N)  # (N, H, 1, m, m)
    index = torch.arange(N)[:, None]
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 1, H, N, m, generator=g, dtype=torch.float64)
    qr, kr = ops.apply_maps(q, maps, index), ops.apply_maps(k, maps, index)
    scores = qr @ kr.transpose(-1, -2)  # (1, H, N, N)
    for p, r in [(0, 5), (3, 8), (7, 2), (4, 4)]:
        rel = (
            torch.linalg.matrix_power(w[:, 0], r - p)
            if r >= p
            else torch.linalg.matrix_power(w[:, 0].transpose(-1, -2), p - r)
        )
        expected = torch.einsum("hi,hij,hj->h", q[0, :, p], rel, k[0, :, r])
        torch.testing.assert_close(scores[0, :, p, r], expected)


def test_grid_scores_are_direct_sums_per_axis():
    H, grid, m = 2, [3, 4], 4
    enc = AlgebraicEncoder(2 * m, H, kind="grid", ndim=2, init="random").double()
    maps, index = enc.grid_maps(grid)
    w = enc.orthogonal_maps()  # (H, 2, m, m)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 1, H, 12, 2 * m, generator=g, dtype=torch.float64)
    qr, kr = ops.apply_maps(q, maps, index), ops.apply_maps(k, maps, index)
    scores = (qr @ kr.transpose(-1, -2))[0]
    coords = index
    for i, j in [(0, 11), (5, 6), (10, 1)]:
        expected = torch.zeros(H, dtype=torch.float64)
        for a in range(2):
            delta = int(coords[j, a] - coords[i, a])
            rel = torch.linalg.matrix_power(w[:, a] if delta >= 0 else w[:, a].transpose(-1, -2), abs(delta))
            expected += torch.einsum(
                "hi,hij,hj->h", q[0, :, i, a * m : (a + 1) * m], rel, k[0, :, j, a * m : (a + 1) * m]
            )
        torch.testing.assert_close(scores[:, i, j], expected)


def heap_child(p, c, kappa):
    return kappa * p + c


def heap_node(path, kappa, root=1):
    node = root
    for c in path:
        node = heap_child(node, c, kappa)
    return node


@pytest.mark.parametrize("kappa", [2, 3])
def test_tree_scores_depend_only_on_the_path_between_nodes(kappa):
    """The shared prefix (root to the common ancestor) cancels in q' . k'."""
    H, m, depth = 2, 4, 5
    enc = AlgebraicEncoder(m, H, kind="tree", kappa=kappa, max_depth=depth, init="random").double()
    g = torch.Generator().manual_seed(kappa)
    q, k = torch.randn(2, H, m, generator=g, dtype=torch.float64)
    rng = torch.Generator().manual_seed(10 + kappa)

    def rand_path(n):
        return torch.randint(0, kappa, (n,), generator=rng).tolist()

    for _ in range(6):
        down_u, down_v = rand_path(2), rand_path(1)
        down_u[0] = (down_v[0] + 1) % kappa  # the paths diverge at the ancestor
        prefixes = [rand_path(1), rand_path(2), []]
        nodes = [(heap_node(p + down_u, kappa), heap_node(p + down_v, kappa)) for p in prefixes]
        positions = torch.tensor([n for pair in nodes for n in pair])
        maps, index = enc.tree_maps(positions)
        x = torch.stack([q, k] * len(nodes), dim=1)[None]  # (1, H, 2 * pairs, m): q at u, k at v
        rot = ops.apply_maps(x, maps, index)[0]
        scores = [(rot[:, 2 * i] * rot[:, 2 * i + 1]).sum(-1) for i in range(len(nodes))]
        for s in scores[1:]:
            torch.testing.assert_close(s, scores[0])
    # and the scores do change with the path between the nodes
    positions = torch.tensor(
        [heap_node([0, 1], kappa), heap_node([1], kappa), heap_node([0, 1], kappa), heap_node([0], kappa)]
    )
    maps, index = enc.tree_maps(positions)
    x = torch.stack([q, k, q, k], dim=1)[None]
    rot = ops.apply_maps(x, maps, index)[0]
    assert not torch.allclose((rot[:, 0] * rot[:, 1]).sum(-1), (rot[:, 2] * rot[:, 3]).sum(-1))


@pytest.mark.parametrize("kappa", [2, 3])
def test_tree_maps_from_parent_arrays_match_heap_order(kappa):
    branch = random_orthogonal(kappa, 2, 1, 3, 3, seed=kappa)
    depth = 3
    heap = tree_maps_heap(branch, depth)
    nodes = [1] + [n for level in range(1, depth + 1) for n in range(kappa**level, 2 * kappa**level)]
    pos = {n: i for i, n in enumerate(nodes)}
    parent = torch.tensor([pos[n // kappa] if n > 1 else pos[n] for n in nodes])
    child = torch.tensor([n % kappa for n in nodes])
    maps = tree_maps_parents(branch, parent, child)
    torch.testing.assert_close(maps, heap[torch.tensor(nodes)])
    # batched trees (two orderings of the same nodes)
    perm = torch.randperm(len(nodes), generator=torch.Generator().manual_seed(0))
    inv = torch.argsort(perm)
    parent2, child2 = inv[parent[perm]], child[perm]
    both = tree_maps_parents(branch, torch.stack([parent, parent2]), torch.stack([child, child2]))
    torch.testing.assert_close(both[1], maps[perm])


def test_map_building_has_no_host_synchronisation():
    """fullgraph compilation fails on any .item()/.tolist() or data-dependent branch."""
    branch = random_orthogonal(2, 2, 1, 4, 4)
    parent = torch.tensor([0, 0, 0, 1, 1, 2])
    child = torch.tensor([0, 0, 1, 0, 1, 0])
    compiled = torch.compile(tree_maps_parents, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(branch, parent, child), tree_maps_parents(branch, parent, child))
    heap = torch.compile(tree_maps_heap, backend="eager", fullgraph=True)
    torch.testing.assert_close(heap(branch, 3), tree_maps_heap(branch, 3))
    enc = AlgebraicEncoder(8, 2, kind="grid", ndim=2)
    maps, index = torch.compile(enc.grid_maps, backend="eager", fullgraph=True)([3, 5])
    torch.testing.assert_close(maps, enc.grid_maps([3, 5])[0])


def test_rope_special_case_equals_the_rope_formula():
    m, N, H = 8, 6, 1
    enc = AlgebraicEncoder(m, H, kind="sequence", init="rope", learnable=False).double()
    assert not list(enc.parameters())
    torch.testing.assert_close(enc.orthogonal_maps()[0, 0], rope_rotation(m, dtype=torch.float64))
    maps, index = enc.grid_maps([N])
    q = torch.randn(1, H, N, m, dtype=torch.float64)
    rot = ops.apply_maps(q, maps, index)
    theta = rope_angles(m, dtype=torch.float64)
    for p in range(N):
        c, s = torch.cos(p * theta), torch.sin(p * theta)
        even, odd = q[0, 0, p, 0::2], q[0, 0, p, 1::2]
        torch.testing.assert_close(rot[0, 0, p, 0::2], even * c - odd * s)
        torch.testing.assert_close(rot[0, 0, p, 1::2], even * s + odd * c)
    torch.testing.assert_close(
        orthogonal(rope_generator_init(m, dtype=torch.float64)), rope_rotation(m, dtype=torch.float64)
    )


def test_rope_init_of_learned_generators():
    enc = AlgebraicEncoder(8, 3, kind="grid", ndim=2, init="rope")
    w = enc.orthogonal_maps()
    torch.testing.assert_close(w, rope_rotation(4).expand(3, 2, 4, 4), rtol=1e-5, atol=1e-6)
    assert enc.generator.requires_grad


def test_algebraic_attention_logits_are_translation_equivariant():
    torch.manual_seed(0)
    attn = AlgebraicSelfAttention(16, 2, AlgebraicEncoder(8, 2, kind="grid", ndim=2, init="random")).double()
    x = torch.randn(1, 1, 16, dtype=torch.float64).expand(1, 20, 16)
    from posattn.nn.attention import split_heads

    q, k, _ = (split_heads(t, 2) for t in attn.qkv(x).chunk(3, -1))
    maps, index = attn.encoder([4, 5])
    qr, kr = ops.apply_maps(q, maps, index), ops.apply_maps(k, maps, index)
    logits = (qr @ kr.transpose(-1, -2)).view(2, 4, 5, 4, 5)
    torch.testing.assert_close(logits[:, :3, :4, :3, :4], logits[:, 1:, 1:, 1:, 1:])


@pytest.mark.parametrize("pe", ["algebraic_seq", "algebraic_grid", "rope"])
def test_classifier_with_algebraic_encodings(pe):
    torch.manual_seed(0)
    model = TransformerClassifier(grid=[6, 4], dim=16, depth=2, heads=2, ffn_dim=16, pe={"name": pe}, pooling="cls")
    y = model(torch.rand(3, 6, 4, 1))
    y.sum().backward()
    assert y.shape == (3, 10) and torch.isfinite(y).all()
    assert all(p.grad is not None for p in model.parameters())
    assert (model.shared_encoder is not None) == True  # noqa: E712  generators shared across layers by default
    per_layer = TransformerClassifier(
        grid=[6, 4], dim=16, depth=2, heads=2, ffn_dim=16, pe={"name": pe, "algebraic_shared": False}
    )
    assert per_layer.shared_encoder is None and per_layer.blocks[0].attention.encoder is not None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(pe={"name": "algebraic_grid"}, dim=12, heads=2), "even blocks"),
        (dict(pe={"name": "algebraic_seq"}, span={"enabled": True}), "span.enabled is not available"),
        (dict(pe={"name": "rope"}, attention="favor"), "needs attention='relpos'"),
        (dict(pe={"name": "algebraic_grid", "init": "ortho"}), "pe.init must be one of"),
    ],
)
def test_bad_algebraic_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerClassifier(grid=[4, 4], **kwargs)


def test_encoder_bad_arguments():
    with pytest.raises(ValueError, match="kind must be one of"):
        AlgebraicEncoder(8, 2, kind="graph")
    with pytest.raises(ValueError, match="split into 3 equal blocks"):
        AlgebraicEncoder(8, 2, kind="grid", ndim=3)
    with pytest.raises(ValueError, match="even block size"):
        AlgebraicEncoder(6, 2, kind="grid", ndim=2)
    with pytest.raises(ValueError, match="built for 2-D grids"):
        AlgebraicEncoder(8, 2, kind="grid", ndim=2).grid_maps([8])
    assert math.isclose(float(rope_angles(4)[1]), 10000**-0.5, rel_tol=1e-6)


def test_tree_maps_heap_rows_can_be_truncated():
    branch = random_orthogonal(3, 2, 1, 3, 3, seed=5)
    full = tree_maps_heap(branch, 3)
    assert full.shape[0] == 2 * 3**3
    for rows in (1, 2, 5, 13, 40):
        torch.testing.assert_close(tree_maps_heap(branch, 3, num_rows=rows), full[:rows])


@pytest.mark.slow
def test_tree_encoding_learns_the_parent_task_sequence_encoding_does_not():
    """experiments/tree_parent.py, small: every node outputs its parent's token."""
    import importlib.util
    import os

    path = os.path.join(ROOT, "experiments", "tree_parent.py")
    spec = importlib.util.spec_from_file_location("tree_parent", path)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    tree = task.train_one("tree", steps=250, depth=5, seed=0)
    sequence = task.train_one("sequence", steps=250, depth=5, seed=0)
    assert tree > 0.95
    assert sequence < tree - 0.2


def test_tree_transformer_shapes_and_padding():
    torch.manual_seed(0)
    from posattn.nn import TreeTransformer

    model = TreeTransformer(5, 3, dim=16, depth=1, heads=2, encoding="tree", max_depth=3)
    tokens = torch.randint(0, 5, (2, 15))
    positions = torch.arange(1, 16).expand(2, 15).clone()
    positions[1, 10:] = 0  # padding rows use the identity map
    out = model(tokens, positions)
    assert out.shape == (2, 15, 3) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="encoding must be"):
        TreeTransformer(5, 3, encoding="graph")
