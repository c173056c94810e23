"""Bad input gets a clear error naming the argument, through the wrapper and the raw op."""

import pytest
import torch
from helpers.relpos import make_relpos_inputs
from torch._subclasses.fake_tensor import FakeTensorMode

from posattn import ops

GRID = [3, 4]


def base():
    return make_relpos_inputs(GRID, sigma=True)


def _huge():
    return torch.zeros(0, 3, 2**56, 5, dtype=torch.float64)


def case(name, change, exc, match, **kw):
    return pytest.param(change, exc, match, kw, id=name)


def _set(key, value):
    def f(x):
        x[key] = value(x) if callable(value) else value
        return x

    return f


BAD = [
    case("q 3-D", _set("q", lambda x: x["q"][0]), ValueError, "q must have shape"),
    case("k shape", _set("k", lambda x: x["k"][:, :, :-1]), ValueError, "k must have the shape of q"),
    case("v tokens", _set("v", lambda x: x["v"][:, :, :-1]), ValueError, "v must have shape"),
    case("grid prod", lambda x: x, ValueError, r"prod\(grid\) = 15", grid=[3, 5]),
    case("grid zero", lambda x: x, ValueError, "grid axis .*must be >= 1", grid=[0, 12]),
    case("grid 9 axes", lambda x: x, ValueError, "grid may have at most 8 axes, got 9", grid=[1] * 7 + [3, 4]),
    case(
        "rel shape",
        _set("rel", lambda x: x["rel"][:, :-1]),
        ValueError,
        r"rel must have shape \(H, U, D\) = \(3, 35, 5\)",
    ),
    case("q_pos without rel", _set("rel", None), ValueError, "q_pos and rel must be given together"),
    case("q_pos shape", _set("q_pos", lambda x: x["q_pos"][..., :-1]), ValueError, "q_pos must have the shape of q"),
    case("sigma shape", _set("sigma", lambda x: x["sigma"][:, :1]), ValueError, r"sigma must have shape \(H, G\)"),
    case("sigma zero", _set("sigma", lambda x: x["sigma"] * 0), ValueError, "sigma must be positive and finite"),
    case("sigma negative", _set("sigma", lambda x: -x["sigma"]), ValueError, "sigma must be positive and finite"),
    case(
        "sigma nan", _set("sigma", lambda x: x["sigma"] * float("nan")), ValueError, "sigma must be positive and finite"
    ),
    case(
        "sigma inf", _set("sigma", lambda x: x["sigma"] * float("inf")), ValueError, "sigma must be positive and finite"
    ),
    case("threshold 1", lambda x: x, ValueError, r"threshold must be in \[0, 1\)", threshold=1.0),
    case("threshold negative", lambda x: x, ValueError, r"threshold must be in \[0, 1\)", threshold=-0.1),
    case("threshold without sigma", _set("sigma", None), ValueError, "threshold > 0 requires sigma", threshold=0.1),
    case("span mode", lambda x: x, ValueError, "span_mode must be", span_mode="gauss"),
    case(
        "dtype mix",
        _set("k", lambda x: x["k"].float()),
        TypeError,
        "k has dtype .*(float32|Float) but q has dtype .*(float64|Double)",
    ),
    case("sigma dtype", _set("sigma", lambda x: x["sigma"].float()), TypeError, "sigma has dtype"),
    case(
        "int tensors",
        lambda x: {k: (v * 10).long() for k, v in x.items()},
        TypeError,
        "must be a floating-point tensor",
    ),
    case("scale nan", lambda x: x, ValueError, "scale must be finite", scale=float("nan")),
    case(
        "scale overflows float32",
        lambda x: {k: v.float() for k, v in x.items()},
        ValueError,
        "scale = 1e\\+300 overflows the tensors' dtype",
        scale=1e300,
    ),
    # The product wraps around int64 to N = 12: the overflow is caught, not read as N.
    case("grid product overflows int64", lambda x: x, ValueError, "too large", grid=[2**62 + 3, 4]),
    # prod(grid) = 2**56 fits, prod(2 n - 1) = 255**8 does not (empty tensors: B = 0).
    case(
        "offsets overflow int64",
        lambda x: dict(x, q=_huge(), k=_huge(), q_pos=_huge(), v=_huge(), sigma=None),
        ValueError,
        "too large",
        grid=[128] * 8,
    ),
]


@pytest.mark.parametrize("change,exc,match,kw", BAD)
def test_wrapper_rejects(change, exc, match, kw):
    x = change(base())
    args = dict(grid=GRID)
    args.update(kw)
    with pytest.raises(exc, match=match):
        ops.relpos_attention(**x, **args)


@pytest.mark.parametrize("change,exc,match,kw", BAD)
def test_raw_op_rejects(change, exc, match, kw):
    """The C++ operator checks its inputs too (for callers of torch.ops.posattn directly)."""
    x = change(base())
    args = dict(grid=GRID, threshold=0.0, span_mode="add", scale=0.5)
    args.update(kw)
    with pytest.raises(exc, match=match):
        torch.ops.posattn.relpos_attention(
            x["q"],
            x["k"],
            x["v"],
            x.get("q_pos"),
            x.get("rel"),
            args["grid"],
            x.get("sigma"),
            args["threshold"],
            args["span_mode"],
            args["scale"],
            False,
        )


VALUE_CHECKS = ("sigma must be positive and finite",)  # need tensor values, which a fake tensor has not


@pytest.mark.parametrize("change,exc,match,kw", [p for p in BAD if p.values[2] not in VALUE_CHECKS])
def test_fake_kernel_rejects(change, exc, match, kw):
    """The fake kernel (torch.compile's shape inference) runs the Python checks: the
    same table, the same errors as the C++ operator."""
    x = change(base())
    args = dict(grid=GRID, threshold=0.0, span_mode="add", scale=0.5)
    args.update(kw)
    with FakeTensorMode() as mode:
        f = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
        with pytest.raises(exc, match=match):
            torch.ops.posattn.relpos_attention(
                f["q"],
                f["k"],
                f["v"],
                f.get("q_pos"),
                f.get("rel"),
                args["grid"],
                f.get("sigma"),
                args["threshold"],
                args["span_mode"],
                args["scale"],
                False,
            )


def test_not_a_tensor():
    x = base()
    with pytest.raises(TypeError, match="q must be a tensor"):
        ops.relpos_attention(x["q"].tolist(), x["k"], x["v"])


def test_device_mismatch_is_reported():
    x = base()
    meta_k = x["k"].to("meta")
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        ops.relpos_attention(x["q"], meta_k, x["v"], grid=GRID)


def test_unsupported_cpu_dtype():
    x = {k: v.half() for k, v in base().items()}
    with pytest.raises(TypeError, match="float32 or float64"):
        ops.relpos_attention(**x, grid=GRID)


def test_backward_checks_its_tensors():
    x = base()
    out, lse = torch.ops.posattn.relpos_attention(
        x["q"], x["k"], x["v"], None, None, GRID, None, 0.0, "add", 1.0, False
    )
    with pytest.raises(ValueError, match="grad_out must have shape"):
        torch.ops.posattn.relpos_attention_backward(
            out[:, :, :-1], None, x["q"], x["k"], x["v"], None, None, GRID, None, 0.0, "add", 1.0, False, out, lse
        )
    with pytest.raises(ValueError, match="lse must have shape"):
        torch.ops.posattn.relpos_attention_backward(
            out, None, x["q"], x["k"], x["v"], None, None, GRID, None, 0.0, "add", 1.0, False, out, lse[..., :-1]
        )
