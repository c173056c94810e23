"""experiments/swin_bias_study.py: its eager model is the posattn model computed the eager way."""

import importlib.util
import os
import sys
from types import SimpleNamespace

import torch
from helpers import ROOT


def load_study():
    path = os.path.join(ROOT, "experiments", "swin_bias_study.py")
    spec = importlib.util.spec_from_file_location("swin_bias_study", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["swin_bias_study"] = module
    spec.loader.exec_module(module)
    return module


def test_eager_and_posattn_models_agree():
    study = load_study()
    args = SimpleNamespace(dim=12, depth=2, heads=3, window=7, patch=2)
    fused, eager = study.build_model(args, 0, "posattn"), study.build_model(args, 0, "eager")
    assert type(eager.blocks[0].attention).__name__ == "EagerBiasAttention"
    x = torch.randn(3, 28, 28, 1)
    out_f, out_e = fused(x), eager(x)
    torch.testing.assert_close(out_f, out_e, rtol=1e-4, atol=1e-5)
    g_f = torch.autograd.grad(out_f.square().sum(), fused.blocks[0].attention.position_bias.table)[0]
    g_e = torch.autograd.grad(out_e.square().sum(), eager.blocks[0].attention.position_bias.table)[0]
    torch.testing.assert_close(g_f, g_e, rtol=1e-4, atol=1e-5)


def test_summary_and_plot(tmp_path):
    study = load_study()
    rows = [
        dict(
            backend=b,
            seed=s,
            test_acc=0.8 + 0.01 * s,
            ms_per_step=10.0 * (1 + (b == "eager")),
            peak_step_mib=5.0 * (1 + 9 * (b == "eager")),
        )
        for s in (0, 1)
        for b in study.BACKENDS
    ]
    study.write_csv(tmp_path / "runs.csv", rows)
    back = study.read_csv(tmp_path / "runs.csv")
    args = SimpleNamespace(train_images=100, epochs=1, dim=12, depth=2, heads=3, batch_size=64, patch=1)
    text = study.summarise(back, args)
    assert "eager / posattn time per step 2.00x" in text and "peak memory of a step 0.10" in text
    study.plot(back, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").exists()
