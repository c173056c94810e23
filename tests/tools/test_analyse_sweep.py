"""experiments/analyse_sweep.py: settings grouped over seeds, Welch's t-test, span statistics, plots."""

import csv
import importlib.util
import json
import os

from helpers import ROOT
from scipy import stats


def load_script():
    spec = importlib.util.spec_from_file_location(
        "analyse_sweep", os.path.join(ROOT, "experiments", "analyse_sweep.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_sweep(folder):
    """Two settings x three seeds; the span runs log sigma per layer and axis, and a test line last."""
    acc = {"0.0": [0.80, 0.82, 0.81], "0.1": [0.70, 0.74, 0.69]}
    rows = []
    for threshold, values in acc.items():
        for i, (seed, a) in enumerate(zip((1, 2, 3), values)):
            run = f"s-{len(rows):03d}"
            rows.append(
                {
                    "run": run,
                    "span.threshold": threshold,
                    "seed": seed,
                    "val/best_acc": a,
                    "test/acc": a - 0.01,
                    "epochs": 2,
                    "train_seconds": 10.0,
                }
            )
            os.makedirs(folder / run)
            epoch = {
                "epoch": 2,
                "time/per_step_ms": 100.0 + i,
                "span/layer0/sigma_axis0": 0.2,
                "span/layer0/sigma_axis1": 0.4,
                "span/layer0/keep_fraction": 0.5,
                "span/layer1/sigma_axis0": 0.1,
                "span/layer1/sigma_axis1": 0.1,
                "span/layer1/keep_fraction": 0.25,
            }
            with open(folder / run / "metrics.jsonl", "w") as f:
                f.write(
                    json.dumps(dict(epoch, epoch=1))
                    + "\n"
                    + json.dumps(epoch)
                    + "\n"
                    + json.dumps({"test/acc": a})
                    + "\n"
                )
    with open(folder / "sweep_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return acc


def test_tables_welch_and_plots(tmp_path):
    acc = fake_sweep(tmp_path / "s")
    out = tmp_path / "out"
    assert load_script().main([str(tmp_path / "s"), "--out", str(out), "--scale", "tiny"]) == 0
    for name in ("sweep_summary.csv", "settings.csv", "welch.csv", "results.md", "accuracy.png", "span.png"):
        assert (out / name).stat().st_size > 0, name
    settings = list(csv.DictReader(open(out / "settings.csv")))
    assert [s["setting"] for s in settings] == ["0.0", "0.1"] and settings[0]["seeds"] == "3"
    assert settings[0]["val/best_acc mean"] == "0.8100" and settings[0]["val/best_acc sd"] == "0.0100"
    assert settings[0]["ms per step"] == "101"
    (welch,) = csv.DictReader(open(out / "welch.csv"))
    expected = stats.ttest_ind(acc["0.0"], acc["0.1"], equal_var=False).pvalue
    assert abs(float(welch["val/best_acc p"]) - expected) < 5e-3 * expected  # printed to 3 significant digits
    text = (out / "results.md").read_text()
    assert "Scale: tiny" in text and "| 0.0 | 0 | 0.3000 ± 0.0000 | 0.5000 ± 0.0000 |" in text  # sigma: mean over axes


def test_thesis_study_names_the_eight_settings(tmp_path, monkeypatch):
    """experiments/thesis_study.py: two sweeps -> the thesis' setting names, its comparisons, published column."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "experiments"))
    spec = importlib.util.spec_from_file_location("thesis_study", os.path.join(ROOT, "experiments", "thesis_study.py"))
    thesis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(thesis)
    runs = tmp_path / "runs"
    for sweep, column, values in (
        ("thesis_cpu_encodings", "positional_encoding", ("sinusoidal", "siren")),
        ("thesis_cpu_span", "span.threshold", ("0.0", "0.1")),
    ):
        rows = []
        for positions in ("sequence", "grid"):
            for value in values:
                for seed, acc in ((1, 0.70), (2, 0.72)):
                    acc += 0.1 * (positions == "grid")
                    rows.append(
                        {
                            "run": f"r{len(rows)}",
                            "model.positions": positions,
                            column: value,
                            "seed": seed,
                            "val/best_acc": acc,
                            "test/acc": acc,
                        }
                    )
        (runs / sweep).mkdir(parents=True)
        with open(runs / sweep / "sweep_summary.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    out = tmp_path / "out"
    assert thesis.main(["--runs", str(runs), "--out", str(out)]) == 0
    settings = [s["setting"] for s in csv.DictReader(open(out / "settings.csv"))]
    assert settings == list(thesis.PUBLISHED)
    welch = list(csv.DictReader(open(out / "welch.csv")))
    assert [(w["A"], w["B"]) for w in welch] == thesis.PAIRS
    assert welch[0]["val/best_acc A-B"] == "+0.1000"
    assert ".8095 ± .0038 (CIFAR-10)" in (out / "results.md").read_text()
