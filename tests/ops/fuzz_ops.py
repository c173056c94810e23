"""Generated bad inputs for the operators; for tests/ops/test_fuzz_ops.py.

    python tests/ops/fuzz_ops.py SEED FIRST COUNT

Runs cases FIRST .. FIRST + COUNT - 1 of the seeded list, printing ``CASE i``
before each and ``OK i`` or ``BAD i <why>`` after it. A case is OK when the call
raises ValueError or TypeError from posattn's checks (the message starts with the
operator's name and names the argument that was broken) or torch's schema error
naming that argument. A crash kills the process after ``CASE i``: the parent
sees which case did it and starts a new process after it.
"""

import logging
import math
import random
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import posattn  # noqa: F401  (registers torch.ops.posattn)
from posattn import ops

RELPOS_TENSORS = ("q", "k", "v", "q_pos", "rel", "sigma")
BAD_NUMBERS = (float("nan"), float("inf"), -float("inf"), -1.0, 1.0, 1e300, 1j, None, "0.5", True)


def relpos_arguments(B, H, N, D, Dv, U, grid, dtype) -> dict:
    """Valid relpos_attention arguments of these sizes (random tensors, span box on)."""
    t = lambda *s: torch.randn(*s, dtype=dtype)  # noqa: E731
    return dict(
        q=t(B, H, N, D),
        k=t(B, H, N, D),
        v=t(B, H, N, Dv),
        q_pos=t(B, H, N, D),
        rel=t(H, U, D),
        grid=grid,
        sigma=torch.rand(H, len(grid), dtype=dtype) + 0.2,
        threshold=0.3,
        span_mode="add",
        scale=0.5,
        causal=False,
    )


def valid_relpos(rng: random.Random) -> dict:
    G = rng.randint(1, 3)
    grid = [rng.choice([1, 2, 3, 5]) for _ in range(G)]
    B, H, D, Dv = rng.randint(1, 2), rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 4)
    N, U = math.prod(grid), math.prod(2 * n - 1 for n in grid)
    dtype = rng.choice([torch.float32, torch.float64])
    return relpos_arguments(B, H, N, D, Dv, U, grid, dtype)


# Axes whose size another argument fixes (v's Dv, x's B and maps' P are free).
FIXED_AXES = {"v": (0, 1, 2), "x": (1, 2, 3), "maps": (1, 2, 3, 4)}


def break_tensor(rng, t: torch.Tensor, name: str = ""):
    """An invalid replacement for tensor ``t`` (and a description)."""
    kind = rng.choice(
        ["drop dim", "extra dim", "resize", "int dtype", "other float dtype", "complex", "meta", "not a tensor", "none"]
    )
    if kind == "drop dim":
        return t[0] if t.dim() > 0 and t.shape[0] > 0 else t.reshape(-1)[:0], kind
    if kind == "extra dim":
        return t[None, None], kind
    if kind == "resize":
        d = rng.choice(FIXED_AXES.get(name, range(t.dim())))
        shape = list(t.shape)
        shape[d] += rng.choice([1, 2, 7])
        return (
            torch.randn(shape, dtype=t.dtype) if t.dtype.is_floating_point else torch.zeros(shape, dtype=t.dtype)
        ), kind
    if kind == "int dtype":
        return (t * 10).to(rng.choice([torch.int64, torch.int32, torch.bool])), kind
    if kind == "other float dtype":
        return t.to(torch.float64 if t.dtype == torch.float32 else torch.float32), kind
    if kind == "complex":
        return t.to(torch.complex64), kind
    if kind == "meta":
        return t.to("meta"), kind
    if kind == "not a tensor":
        return rng.choice([t.tolist(), 3.0, "q", (1, 2)]), kind
    return None, kind


def break_grid(rng, grid):
    kind = rng.choice(
        ["zero", "negative", "float", "string", "too many axes", "overflow", "empty", "wrong product", "nested", "bool"]
    )
    values = {
        "zero": [0] + grid,
        "negative": [-n for n in grid] if grid != [1] else [-1],
        "float": [n + 0.5 for n in grid],
        "string": "".join(map(str, grid)) + "x",
        "too many axes": [1] * 9 + grid,
        "overflow": [2**62 + 1, 4] if math.prod(grid) == 4 else [2**63 - 1, 3],
        "empty": [],
        "wrong product": grid + [2],
        "nested": [grid],
        "bool": [True] * len(grid),
    }
    return values[kind], kind


def relpos_case(rng):
    """(description, argument broken, callable) of one invalid relpos_attention call."""
    args = valid_relpos(rng)
    target = rng.choice(RELPOS_TENSORS + ("grid", "threshold", "scale", "span_mode", "causal", "sigma values"))
    if target in RELPOS_TENSORS:
        args[target], kind = break_tensor(rng, args[target], target)
        if args[target] is None and target in ("q_pos", "rel"):
            kind = "only one of q_pos and rel"
        elif args[target] is None and target == "sigma":
            target = "threshold"  # a threshold without sigma: the error names the threshold
    elif target == "grid":
        args["grid"], kind = break_grid(rng, args["grid"])  # (a bool grid: torch's binding reads True as 1)
    elif target == "sigma values":
        bad = rng.choice([0.0, -0.5, float("nan"), float("inf")])
        args["sigma"] = args["sigma"].clone()
        args["sigma"].view(-1)[rng.randrange(args["sigma"].numel())] = bad
        kind, target = f"value {bad}", "sigma"
    elif target == "span_mode":
        args["span_mode"], kind = rng.choice([("gauss", "unknown name"), ("", "empty"), ("ADD", "upper case")])
    elif target == "causal":
        args["causal"] = rng.choice(["no", None, 2])
        kind = repr(args["causal"])
    else:
        value = rng.choice([v for v in BAD_NUMBERS if not (target == "scale" and v is None)])  # None: default
        if target == "scale" and (value in (-1.0, 1.0) or value is True):
            value = float("nan")
        if target == "threshold" and isinstance(value, float) and 0.0 <= value < 1.0:
            value = 1.0
        if target == "scale" and value == 1e300 and args["q"].dtype == torch.float64:
            value = float("inf")
        args[target] = value
        kind = repr(value)
    entries = ["wrapper", "op", "fake", "backward", "fake backward"]
    if target == "causal" or kind == "bool":
        entries = ["wrapper"]  # the raw op's bool is converted by torch's argument binding (2 -> True)
    elif kind.startswith("value"):
        entries = ["wrapper", "op", "backward"]  # tensor values: a fake kernel has none to check
    entry = rng.choice(entries)
    return f"relpos {entry}: {target} {kind}", target, lambda: call_relpos(entry, args)


def valid_packed(rng: random.Random) -> dict:
    """A valid packed call: S samples of G axes, max_grid at least their extents, tail padding."""
    G, S = rng.randint(1, 3), rng.randint(1, 4)
    shapes = [[rng.choice([1, 2, 3]) for _ in range(G)] for _ in range(S)]
    max_grid = [max(s[d] for s in shapes) + rng.choice([0, 0, 1]) for d in range(G)]
    offsets = [0]
    for shape in shapes:
        offsets.append(offsets[-1] + math.prod(shape))
    T = offsets[-1] + rng.choice([0, 0, 2])
    H, D, Dv = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 4)
    U = math.prod(2 * m - 1 for m in max_grid)
    dtype = rng.choice([torch.float32, torch.float64])
    args = relpos_arguments(1, H, T, D, Dv, U, max_grid, dtype)
    args.update(
        packed_offsets=torch.tensor(offsets, dtype=torch.int32), packed_shapes=torch.tensor(shapes, dtype=torch.int32)
    )
    return args


def packed_case(rng):
    """(description, argument broken, callable) of one invalid packed relpos_attention call."""
    a = valid_packed(rng)
    target = rng.choice(["packed_offsets", "packed_shapes", "packed_offsets values", "packed_shapes values", "q"])
    entries = ["op", "fake", "backward", "fake backward"]
    if target == "q":  # a packed call has one batch row
        for name in ("q", "k", "v", "q_pos"):
            a[name] = torch.cat([a[name]] * 2)
        kind = "B = 2"
    elif target.endswith("values"):
        target = target.split()[0]
        off, shp = a["packed_offsets"].clone(), a["packed_shapes"].clone()
        S, G = shp.shape
        s, d = rng.randrange(S), rng.randrange(G)
        kind = rng.choice(
            ["not from 0", "not increasing", "past T"]
            if target == "packed_offsets"
            else ["zero", "past max_grid", "product"]
        )
        if kind == "not from 0":
            off += 1
        elif kind == "not increasing":
            off[s + 1] = off[s]
        elif kind == "past T":
            off[-1] = a["q"].shape[2] + 3
            shp[-1] = torch.tensor([1] * (G - 1) + [int(off[-1] - off[-2])], dtype=torch.int32)
            a["grid"] = [max(m, int(shp[-1, e])) for e, m in enumerate(a["grid"])]
            a["rel"] = torch.randn(a["rel"].shape[0], math.prod(2 * m - 1 for m in a["grid"]), a["rel"].shape[2],
                                   dtype=a["rel"].dtype)  # fmt: skip
        elif kind == "zero":
            shp[s, d] = 0
        elif kind == "past max_grid":
            shp[s, d] = a["grid"][d] + 1
        else:
            shp[s, d] += 1
        a["packed_offsets"], a["packed_shapes"] = off, shp
        entries = ["op", "backward"]  # tensor values: a fake kernel has none to check
    else:
        t = a[target]
        kind = rng.choice(["int64", "float", "drop dim", "extra dim", "resize", "meta", "not a tensor", "none"])
        if kind == "int64":
            a[target] = t.long()
        elif kind == "float":
            a[target] = t.float()
        elif kind == "drop dim":
            a[target] = t[0]
        elif kind == "extra dim":
            a[target] = t[None]
        elif kind == "resize":
            shape = list(t.shape)
            shape[rng.randrange(len(shape))] += rng.choice([1, 2])
            a[target] = torch.ones(shape, dtype=torch.int32)
        elif kind == "meta":
            a[target] = t.to("meta")
        elif kind == "not a tensor":
            a[target] = rng.choice([t.tolist(), 3.0, "offsets"])
        else:
            a[target] = None
    entry = rng.choice(entries)
    return f"relpos packed {entry}: {target} {kind}", target, lambda: call_relpos(entry, a)


def call_relpos(entry, a):
    if entry == "wrapper":
        return ops.relpos_attention(**a)
    a = dict(a)
    packed = {n: a.pop(n) for n in ("packed_offsets", "packed_shapes") if n in a}
    grid = a["grid"]
    positional = [
        a["q"],
        a["k"],
        a["v"],
        a["q_pos"],
        a["rel"],
        grid,
        a["sigma"],
        a["threshold"],
        a["span_mode"],
        a["scale"],
        a["causal"],
    ]
    if entry == "op":
        return torch.ops.posattn.relpos_attention(*positional, **packed)

    def faked(mode, x):
        return mode.from_tensor(x) if isinstance(x, torch.Tensor) and x.device.type != "meta" else x

    if entry == "fake":
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = [faked(mode, x) for x in positional]
            return torch.ops.posattn.relpos_attention(*fake, **{n: faked(mode, x) for n, x in packed.items()})
    # backward entries: out and lse of the size the call claims (B, H, N, Dv)
    q, v = a["q"], a["v"]
    ok = isinstance(q, torch.Tensor) and q.dim() == 4 and isinstance(v, torch.Tensor) and v.dim() == 4
    B, H, N = q.shape[:3] if ok else (1, 1, 1)
    Dv = v.shape[-1] if ok else 1
    dtype = q.dtype if isinstance(q, torch.Tensor) and q.dtype.is_floating_point else torch.float32
    out, lse = torch.randn(B, H, N, Dv, dtype=dtype), torch.randn(B, H, N, dtype=dtype)
    args = [out, None, *positional, out, lse]
    if entry == "backward":
        return torch.ops.posattn.relpos_attention_backward(*args, **packed)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [faked(mode, x) for x in args]
        return torch.ops.posattn.relpos_attention_backward(*fake, **{n: faked(mode, x) for n, x in packed.items()})


def apply_maps_case(rng):
    B, H, N, A, m, P = (
        rng.randint(1, 2),
        rng.randint(1, 3),
        rng.randint(1, 6),
        rng.randint(1, 3),
        rng.randint(1, 3),
        rng.randint(1, 4),
    )
    dtype = rng.choice([torch.float32, torch.float64])
    a = dict(
        x=torch.randn(B, H, N, A * m, dtype=dtype),
        maps=torch.randn(P, H, A, m, m, dtype=dtype),
        index=torch.randint(0, P, (N, A)),
    )
    target = rng.choice(["x", "maps", "index", "index values"])
    if target == "index values":
        a["index"] = a["index"].clone()
        a["index"].view(-1)[rng.randrange(a["index"].numel())] = rng.choice([-1, P, P + 5, -(2**62)])
        kind, target = "out of range", "index"
    else:
        a[target], kind = break_tensor(rng, a[target], target)
        if (
            target == "index"
            and isinstance(a[target], torch.Tensor)
            and a[target].dtype == torch.int64
            and a[target].dim() in (2, 3)
            and kind in ("int dtype",)
        ):
            a[target] = a[target].to(torch.int32)
    entry = rng.choice(["wrapper", "op", "backward"] + (["fake backward"] if kind != "out of range" else []))

    def call():
        if entry == "wrapper":
            return ops.apply_maps(a["x"], a["maps"], a["index"])
        if entry == "op":
            return torch.ops.posattn.apply_maps(a["x"], a["maps"], a["index"])
        gy = torch.randn(B, H, N, A * m, dtype=dtype)
        args = [gy, a["x"], a["maps"], a["index"], True, True]
        if entry == "backward":
            return torch.ops.posattn.apply_maps_backward(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) and t.device.type != "meta" else t for t in args]
            return torch.ops.posattn.apply_maps_backward(*fake)

    return f"apply_maps {entry}: {target} {kind}", target, call


def make_case(seed: int, i: int):
    rng = random.Random(seed * 100_003 + i)
    torch.manual_seed(seed * 100_003 + i)
    r = rng.random()
    return (relpos_case if r < 0.65 else packed_case if r < 0.8 else apply_maps_case)(rng)


def clear(e: Exception, target: str) -> bool:
    """A clear error: ValueError / TypeError naming the argument, from posattn's
    checks or from torch's schema binding."""
    msg = str(e)
    if isinstance(e, (ValueError, TypeError)) and msg.startswith(("relpos_attention", "apply_maps")):
        return True
    # torch's argument binding: "... for argument 'grid' ..." (a RuntimeError or TypeError)
    return isinstance(e, (RuntimeError, TypeError)) and f"argument '{target}'" in msg


def main(seed: int, first: int, count: int) -> None:
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # it logs every raise
    for i in range(first, first + count):
        print(f"CASE {i}", flush=True)
        name, target, call = make_case(seed, i)
        try:
            call()
        except Exception as e:  # noqa: BLE001 - classifying every error is the point
            verdict = "OK" if clear(e, target) else f"BAD unclear {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        else:
            verdict = "BAD accepted"
        print(f"{verdict.split(' ')[0]} {i} {name} {verdict[3:] if verdict != 'OK' else ''}".rstrip(), flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
