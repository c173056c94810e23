"""The scaling study (posattn.training.scaling, experiments/scaling.py,
cmd/main.py -mode=scaling): a smoke run on tiny sizes, plus its pieces.
No timing thresholds: dense vs span-limited growth is asserted on counted work."""

from __future__ import annotations

import csv
import math
import os
import struct
import subprocess
import sys

import helpers.cli as cli_helpers
import pytest
import torch
from helpers import ROOT

from posattn.nn import SDPAttention
from posattn.training.scaling import (
    EXPONENT_COLUMNS,
    GRADIENT_COLUMNS,
    METHODS,
    QUICK,
    RUNTIME_COLUMNS,
    ScalingConfig,
    exponent_table,
    fit_exponent,
    gradient_point,
    model_for,
    run_study,
    span_sigma_cells,
)


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def png_size(path):
    """(width, height) from a PNG's IHDR; fails on anything that is not a PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82"), f"{path} is truncated"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("scaling"))
    cfg = ScalingConfig.from_dict(dict(QUICK, out=out, repeats=3))
    result = run_study(cfg, progress=False, log=lambda s: None)
    return cfg, result


def test_smoke_run_writes_csvs_with_expected_columns(smoke):
    cfg, result = smoke
    columns, rows = read_csv(result["runtime.csv"])
    assert columns == RUNTIME_COLUMNS
    # every method at every size of every runtime study, all measured
    expected = len(cfg.methods) * (len(cfg.lengths) + len(cfg.grid_sides) + len(cfg.depths))
    assert len(rows) == expected
    assert {r["method"] for r in rows} == set(METHODS)
    assert {r["study"] for r in rows} == {"length", "grid", "depth"}
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["seconds"]) > 0 and float(r["peak_mib"]) >= 0
        assert 0 < float(r["keep_fraction"]) <= 1
    # the span methods keep fewer keys than dense ones on the largest sequence
    largest = str(max(cfg.lengths))
    keep = {r["method"]: float(r["keep_fraction"]) for r in rows if r["study"] == "length" and r["grid"] == largest}
    assert keep["relpos"] == 1.0
    assert keep["relpos_span1"] < keep["relpos_span10"] < 0.5

    columns, rows = read_csv(result["exponents.csv"])
    assert columns == EXPONENT_COLUMNS
    assert len(rows) == 3 * len(METHODS)
    columns, rows = read_csv(result["gradients.csv"])
    assert columns == GRADIENT_COLUMNS
    assert len(rows) == 2 * 4 * len(cfg.gradient_depths)


def test_smoke_run_writes_valid_pngs_and_summary(smoke):
    _, result = smoke
    for name in ("runtime_vs_tokens.png", "memory_vs_tokens.png", "runtime_vs_depth.png", "gradients_vs_depth.png"):
        width, height = png_size(result[name])
        assert width > 300 and height > 200
    with open(result["summary.md"]) as f:
        text = f.read()
    assert "Fitted growth exponents" in text and "| reference |" in text and "first encoder layer" in text


def kept_pairs_exponent(rows, study, method):
    """Growth exponent of the (query, key) pairs a method computes, counted from
    what the code decides (the span's kept-key fraction), not timed."""
    points = sorted(
        (r["tokens"], r["keep_fraction"] * r["tokens"] ** 2)
        for r in rows
        if r["study"] == study and r["method"] == method and r["status"] == "ok"
    )
    assert len(points) >= 3, (study, method, points)
    return fit_exponent(*zip(*points))


@pytest.mark.parametrize("study", ["length", "grid"])
def test_dense_grows_faster_than_span_limited(smoke, study):
    """The dense reference computes N^2 pairs; a span with a threshold keeps a
    box of the same size on every grid, so about N pairs. Wall-clock exponents
    are the scaling benchmark's business (noisy on a shared machine)."""
    _, result = smoke
    assert kept_pairs_exponent(result["rows"], study, "reference") == pytest.approx(2.0)
    span = kept_pairs_exponent(result["rows"], study, "relpos_span1")
    assert 0.9 < span < 1.3
    assert span < kept_pairs_exponent(result["rows"], study, "relpos_span10") < 1.5


def test_fit_exponent_recovers_powers():
    ns = [64, 128, 256, 1024]
    assert fit_exponent(ns, [3e-6 * n**2 for n in ns]) == pytest.approx(2.0)
    assert fit_exponent(ns, [0.5 * n for n in ns]) == pytest.approx(1.0)
    assert math.isnan(fit_exponent([64], [1.0]))
    assert math.isnan(fit_exponent([64, 128], [float("nan"), float("nan")]))


def test_exponent_table_fits_the_larger_half():
    sizes = [1, 2, 4, 8, 16, 32]
    # flat (overhead-bound) at small sizes, quadratic above
    secs = [1.0, 1.0, 1.0, 4.0, 16.0, 64.0]
    rows = [
        dict(study="length", method="relpos", tokens=n, depth=2, seconds=t, status="ok") for n, t in zip(sizes, secs)
    ]
    rows.append(dict(study="length", method="relpos", tokens=64, depth=2, seconds=float("nan"), status="skipped: x"))
    (e,) = exponent_table(rows)
    assert e["points"] == 6 and e["expected"] == "2"
    assert e["exponent_large"] == pytest.approx(2.0)
    assert e["exponent_all"] < 1.8


def test_budgets_skip_points_with_a_reason(tmp_path):
    cfg = ScalingConfig.from_dict(
        dict(
            QUICK,
            out=str(tmp_path),
            methods=["reference", "relpos"],
            studies=["length"],
            max_memory_gib=1e-4,
            max_step_seconds=1e-9,
            repeats=1,
            warmup=0,
        )
    )
    rows = run_study(cfg, progress=False, log=lambda s: None)["rows"]
    ref = [r for r in rows if r["method"] == "reference"]
    assert all("max_memory_gib" in r["status"] for r in ref[1:])
    relpos = sorted((r for r in rows if r["method"] == "relpos"), key=lambda r: r["tokens"])
    assert relpos[0]["status"] == "ok"
    assert all("max_step_seconds" in r["status"] for r in relpos[1:])


def test_span_sigma_cells_keeps_the_same_box_on_every_grid():
    cfg = ScalingConfig()
    sigma = span_sigma_cells(cfg, "relpos_span1", [64, 64])
    boxes = [model_for(cfg, "relpos_span1", [n, n], 1, sigma).spans()[0].box_sizes([n, n])[0] for n in (16, 32, 64)]
    assert boxes[0] == boxes[1] == boxes[2]
    keep = model_for(cfg, "relpos_span1", [64, 64], 1, sigma).span_stats([64, 64])["layer0/keep_fraction"]
    assert 0.005 < keep < 0.02


def test_gradients_vanish_without_residuals_and_layer_norm():
    cfg = ScalingConfig.from_dict(dict(QUICK))
    plain = [gradient_point(cfg, "abs_learned", False, "none", d, seed=0) for d in (1, 4)]
    resid = [gradient_point(cfg, "abs_learned", True, "post", d, seed=0) for d in (1, 4)]
    assert plain[1]["first_layer_grad"] < 0.1 * plain[0]["first_layer_grad"]
    assert resid[1]["first_layer_grad"] > 0.1 * resid[0]["first_layer_grad"]
    assert plain[1]["positional_grad"] < resid[1]["positional_grad"]
    fixed = gradient_point(cfg, "abs_sinusoidal", True, "post", 2, seed=0)
    assert math.isnan(fixed["positional_grad"]) and fixed["embedding_grad"] > 0


@pytest.mark.parametrize(
    "values, match",
    [
        (dict(methods=["dense"]), "unknown method"),
        (dict(studies=["width"]), "unknown"),
        (dict(lengths=[]), "lengths"),
        (dict(dim=18, heads=2), "multiple of 4"),
        (dict(threshold=1.5), "threshold"),
        (dict(batchsize=2), "unknown scaling setting"),
    ],
)
def test_config_errors_name_the_setting(values, match):
    with pytest.raises(ValueError, match=match):
        ScalingConfig.from_dict(values)


def test_cli_mode_scaling(tmp_path, capsys):
    rc = cli_helpers.main(
        [
            "-mode=scaling",
            "-Dscaling.quick=true",
            f"-Dscaling.out={tmp_path}",
            "-Dscaling.studies=[grid]",
            "-Dscaling.methods=[relpos, sdpa]",
            "-Ddevice=cpu",
        ]
    )
    assert rc == 0
    _, rows = read_csv(os.path.join(tmp_path, "runtime.csv"))
    assert {r["method"] for r in rows} == {"relpos", "sdpa"} and len(rows) == 2 * len(QUICK["grid_sides"])
    assert cli_helpers.main(["-mode=scaling", "-Dscaling.methods=[nope]", f"-Dscaling.out={tmp_path}"]) == 2
    assert "unknown method" in capsys.readouterr().err


def test_script_quick_run(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "experiments", "scaling.py"),
            "--quick",
            "--studies",
            "gradients",
            "--gradient-depths",
            "1",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    _, rows = read_csv(os.path.join(tmp_path, "gradients.csv"))
    assert sorted({int(r["depth"]) for r in rows}) == [1, 2]
    png_size(os.path.join(tmp_path, "gradients_vs_depth.png"))
    bad = subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "scaling.py"), "--dim", "18"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "multiple of 4" in bad.stderr


def test_sdpa_attention_matches_softmax_attention():
    torch.manual_seed(0)
    attn = SDPAttention(12, 3).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    q, k, v = attn.qkv(x).chunk(3, dim=-1)
    q, k, v = (t.view(2, 7, 3, 4).transpose(1, 2) for t in (q, k, v))
    w = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
    expected = attn.proj((w @ v).transpose(1, 2).reshape(2, 7, 12))
    torch.testing.assert_close(attn(x, [7]), expected)
    with pytest.raises(ValueError, match="shared must be None"):
        attn(x, [7], shared=torch.zeros(1))
    with pytest.raises(ValueError, match="multiple of heads"):
        SDPAttention(10, 3)
