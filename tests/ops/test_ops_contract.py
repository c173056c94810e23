"""The operators' promises beyond the math: NaN and inf stay visible, a double
backward is refused, arguments are never coerced, and the backward ops check
what they are given (also their fake kernels)."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

from posattn import ops
from posattn import reference as ref
from posattn.nn import ModelConfig, TransformerClassifier

CONFIGS = [
    pytest.param([7], {}, id="1d"),
    pytest.param([7], dict(causal=True), id="1d-causal"),
    pytest.param([4, 5], dict(threshold=0.3), id="2d-box"),
    pytest.param([3, 1, 4], dict(span_mode="multiply"), id="3d-multiply"),
    pytest.param([9, 9], dict(threshold=0.5), id="2d-large-box"),  # several tiles and chunks
]


def _both(x, grid, kw):
    sigma = "threshold" in kw or "span_mode" in kw
    args = dict(x, grid=grid, return_lse=True, **kw)
    if not sigma:
        args.pop("sigma", None)
    return ops.relpos_attention(**args), ref.relpos_attention(**args)


@pytest.mark.parametrize("kernel", ["tiled", "window"])  # POSATTN_CPU_KERNEL (with a threshold)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("grid,kw", CONFIGS)
@pytest.mark.parametrize("where", ["q", "k", "v", "q_pos", "rel", "inf_k"])
def test_nan_and_inf_propagate_as_in_the_reference(grid, kw, where, dtype, kernel, monkeypatch):
    monkeypatch.setenv("POSATTN_CPU_KERNEL", kernel)
    x = make_relpos_inputs(grid, sigma=True, dtype=dtype, seed=3)
    N = x["q"].shape[2]
    j = N // 2
    if where == "rel":
        x["rel"][1, x["rel"].shape[1] // 2, 0] = float("nan")  # offset 0: every query of head 1 reads it
    elif where == "inf_k":
        x["k"][0, 1, j, 0] = float("inf")
    else:
        x[where][0, 1, j, 0] = float("nan")
    (out, lse), (out_ref, lse_ref) = _both(x, grid, kw)
    bad_rows = out_ref.isnan().any(-1)
    assert bad_rows.any(), "the poisoned input must reach some row"
    if where == "v":
        # Every query that keeps key j turns NaN. A masked key's value may reach a row
        # too (0 * NaN: the dense reference reads every value, the kernels every value
        # of a tile they visit), but no row beyond the reference's.
        scores = ref.relpos_scores(
            x["q"],
            x["k"],
            x["q_pos"],
            x["rel"],
            grid,
            x["sigma"] if kw.keys() & {"threshold", "span_mode"} else None,
            **kw,
        )
        keeps = torch.zeros_like(bad_rows)
        keeps[0, 1] = scores[0, 1, :, j] > float("-inf")
        mine = out.isnan().any(-1)
        assert (mine | ~keeps).all() and (bad_rows | ~mine).all()
        return
    assert torch.equal(out.isnan().any(-1), bad_rows)
    assert torch.equal(lse.isfinite(), lse_ref.isfinite())
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else {}
    good = ~bad_rows
    torch.testing.assert_close(out[good], out_ref[good], **tol)


@pytest.mark.parametrize("kernel", ["tiled", "window"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_plus_inf_logit_gives_lse_plus_inf_and_a_nan_row(kernel, dtype, monkeypatch):
    """A kept logit of +inf: lse is +inf (not NaN) and the row's output NaN, as in the reference."""
    monkeypatch.setenv("POSATTN_CPU_KERNEL", kernel)
    grid = [7, 6]
    x = make_relpos_inputs(grid, sigma=True, bias=True, dtype=dtype, seed=4)
    U = x["bias"].shape[1]
    x["bias"][1, U // 2] = float("inf")  # offset 0 of head 1: every query keeps itself
    x["bias"][0, U // 2 + 1] = float("inf")  # one offset of head 0: the queries that keep their right neighbour
    kw = dict(threshold=0.3)
    (out, lse), (out_ref, lse_ref) = _both(x, grid, kw)
    assert (lse_ref == float("inf")).any() and torch.isfinite(lse_ref).any()
    assert torch.equal(lse == float("inf"), lse_ref == float("inf"))
    assert not lse.isnan().any()
    assert torch.equal(out.isnan(), out_ref.isnan())
    good = torch.isfinite(lse_ref)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(out[good], out_ref[good], **tol)
    torch.testing.assert_close(lse[good], lse_ref[good], **tol)


def test_a_row_with_every_key_masked_has_zero_gradients_in_the_op_and_the_reference():
    """Causal, and a -inf bias on offset 0: the first query keeps nothing (out 0, lse -inf). Its
    output does not depend on any input, so nothing flows back through it (the reference's
    logsumexp alone would give 0 / 0 = NaN)."""
    grid = [4, 5]
    x = make_relpos_inputs(grid, bias=True, requires_grad=True, seed=5)
    with torch.no_grad():
        x["bias"][0, x["bias"].shape[1] // 2] = float("-inf")
    grads = []
    for fn in (ops.relpos_attention, ref.relpos_attention):
        out, lse = fn(**x, grid=grid, causal=True, return_lse=True)
        assert torch.isneginf(lse[:, 0, 0]).all() and (out[:, 0, 0] == 0).all()
        g = torch.autograd.grad((out * 1.3).sum() + lse.masked_fill(lse.isneginf(), 0).sum(), list(x.values()))
        assert all(torch.isfinite(t).all() for t in g)
        grads.append(g)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_nan_gradient_is_nan_where_the_reference_is():
    grid = [5, 3]
    x = make_relpos_inputs(grid, requires_grad=True, seed=1)
    with torch.no_grad():
        x["q"][1, 0, 4, 2] = float("nan")
    for fn in (ops.relpos_attention, ref.relpos_attention):
        for t in x.values():
            t.grad = None
        fn(**x, grid=grid).sum().backward()
        grads = [t.grad.isnan() for t in x.values()]
        if fn is ops.relpos_attention:
            mine = grads
        else:
            for a, b in zip(mine, grads):
                assert torch.equal(a, b)
    assert mine[0].any()


def test_model_with_one_nan_pixel_gives_nan_logits():
    cfg = ModelConfig.from_dict(
        dict(grid=[6, 6], in_channels=1, num_classes=3, dim=16, depth=1, heads=2, pe=dict(name="lookup"))
    )
    model = TransformerClassifier(cfg).eval()
    x = torch.randn(2, 6, 6, 1)
    x[0, 2, 3, 0] = float("nan")
    logits = model(x)
    assert logits[0].isnan().all() and logits[1].isfinite().all()


def test_double_backward_is_refused_with_a_clear_error():
    x = make_relpos_inputs([4, 3], requires_grad=True)
    out = ops.relpos_attention(**x, grid=[4, 3])
    (gq,) = torch.autograd.grad(out.square().sum(), x["q"], create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* relpos_attention is not supported"):
        gq.sum().backward()
    xm = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    maps = torch.randn(3, 3, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 3, (5, 2))
    (gx,) = torch.autograd.grad(ops.apply_maps(xm, maps, index).square().sum(), xm, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* apply_maps is not supported"):
        gx.sum().backward()
    # a single backward (no graph of it) still works
    ops.relpos_attention(**{k: v.detach().requires_grad_() for k, v in x.items()}, grid=[4, 3]).sum().backward()


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        (dict(grid=[3.7, 4]), TypeError, "grid must be a sequence of ints"),
        (dict(grid="34"), TypeError, "grid must be a sequence of ints"),
        (dict(grid=[True, 12]), TypeError, "grid must be a sequence of ints"),
        (dict(causal="no"), TypeError, "causal must be True or False"),
        (dict(causal=1), TypeError, "causal must be True or False"),
        (dict(return_lse="yes"), TypeError, "return_lse must be True or False"),
        (dict(k=None), TypeError, "k must be a tensor"),
        (dict(v=None), TypeError, "v must be a tensor"),
        (dict(threshold=None), TypeError, "threshold must be a real number"),
        (dict(scale=1j), TypeError, "scale must be a real number"),
        (dict(scale="0.5"), TypeError, "scale must be a real number"),
    ],
)
def test_arguments_are_never_coerced(kw, exc, match):
    x = make_relpos_inputs([3, 4])
    args = dict(x, grid=[3, 4])
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.relpos_attention(**args)


def test_numpy_ints_are_ints():
    np = pytest.importorskip("numpy")
    x = make_relpos_inputs([3, 4])
    ops.relpos_attention(**x, grid=np.array([3, 4]))


def test_reference_handles_zero_heads_with_a_threshold():
    q = torch.randn(2, 0, 6, 4)
    out = ref.relpos_attention(q, q, q, grid=[2, 3], sigma=torch.rand(0, 2) + 0.1, threshold=0.2)
    assert out.shape == (2, 0, 6, 4)


def _backward_args(x, grid):
    out, lse = torch.ops.posattn.relpos_attention(
        x["q"], x["k"], x["v"], x["q_pos"], x["rel"], grid, None, 0.0, "add", 0.5, False
    )
    return dict(
        grad_out=torch.ones_like(out),
        grad_lse=None,
        q=x["q"],
        k=x["k"],
        v=x["v"],
        q_pos=x["q_pos"],
        rel=x["rel"],
        grid=grid,
        sigma=None,
        threshold=0.0,
        span_mode="add",
        scale=0.5,
        causal=False,
        out=out,
        lse=lse,
    )


def _call_backward(a):
    return torch.ops.posattn.relpos_attention_backward(*a.values())


@pytest.mark.parametrize("name", ["grad_out", "q", "k", "v", "q_pos", "rel", "out", "lse"])
def test_raw_backward_refuses_a_meta_argument(name):
    """One meta tensor among CPU ones used to run the fake kernel and return
    uninitialised CPU memory."""
    a = _backward_args(make_relpos_inputs([3, 4]), [3, 4])
    a[name] = a[name].to("meta")
    with pytest.raises(ValueError, match=f"{name} is on meta|is on cpu but q is on meta"):
        _call_backward(a)


@pytest.mark.parametrize(
    "name,change,match",
    [
        ("grad_out", lambda t: t[..., :-1], "grad_out must have shape"),
        ("out", lambda t: t[:, :1], "out must have shape"),
        ("lse", lambda t: t[..., :-1], "lse must have shape"),
        ("k", lambda t: t[:, :, :-1], "k must have the shape of q"),
        ("rel", lambda t: t[:, :-1], "rel must have shape"),
        ("grad_out", lambda t: t.float(), "grad_out has dtype"),
    ],
)
def test_backward_fake_checks_like_the_forward_fake(name, change, match):
    a = _backward_args(make_relpos_inputs([3, 4]), [3, 4])
    a[name] = change(a[name])
    with pytest.raises((ValueError, TypeError), match=match):  # the C++ kernel
        _call_backward(a)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in a.items()}
        with pytest.raises((ValueError, TypeError), match=match):  # the fake kernel
            _call_backward(fake)


def test_apply_maps_backward_fake_checks_its_arguments():
    x = torch.randn(2, 3, 5, 4)
    maps = torch.randn(3, 3, 2, 2, 2)
    index = torch.randint(0, 3, (5, 2))
    with FakeTensorMode() as mode:
        fx, fmaps, findex = (mode.from_tensor(t) for t in (x, maps, index))
        with pytest.raises(ValueError, match="grad_y must have the shape of x"):
            torch.ops.posattn.apply_maps_backward(fx[..., :-1], fx, fmaps, findex, True, True)
        with pytest.raises(ValueError, match="maps has 2 heads but x has 3"):
            torch.ops.posattn.apply_maps_backward(fx, fx, fmaps[:, :2], findex, True, True)
    with pytest.raises(ValueError, match="must be on one device|must be on cpu"):
        torch.ops.posattn.apply_maps_backward(x.to("meta"), x, maps, index, True, True)


def test_apply_maps_propagates_nan_like_the_reference():
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    maps = torch.randn(3, 3, 2, 2, 2, dtype=torch.float64)
    index = torch.randint(0, 3, (5, 2))
    x[1, 2, 3, 1] = float("nan")
    maps[index[0, 1], 0, 1, 0, 1] = float("inf")
    y, y_ref = ops.apply_maps(x, maps, index), ref.apply_maps(x, maps, index)
    assert y.isnan().any() and torch.equal(y.isnan(), y_ref.isnan()) and torch.equal(y.isinf(), y_ref.isinf())
