"""One Performer recipe: cmd/main.py's -Dmodel.variant=<name> builds the model posattn.nn.<name>() builds."""

import helpers.cli as cli_helpers
import pytest
import torch
import yaml

from posattn.nn import ClippedRelativePerformer, NoPosPerformer, Performer, RelativePerformer
from posattn.training import sweep as sweep_mod
from posattn.training.data import Splits
from posattn.training.train import apply_model_variant, build_model, upgrade_saved_config

MODELS = {
    "Performer": Performer,
    "NoPosPerformer": NoPosPerformer,
    "RelativePerformer": RelativePerformer,
    "ClippedRelativePerformer": ClippedRelativePerformer,
}


def splits(size=32):
    empty = (torch.zeros(0, size, size, 1), torch.zeros(0, dtype=torch.long))
    return Splits(
        train=empty, val=empty, test=empty, grid=[size, size], channels=1, num_classes=10, mean=[0.0], std=[1.0]
    )


def cli_model(overrides):
    given: set = set()
    cfg = cli_helpers._load_config(cli_helpers.defaults(), None, list(overrides), given)
    return build_model(apply_model_variant(cfg, given), splits())


@pytest.mark.parametrize("variant", list(MODELS))
def test_cli_variant_builds_the_library_model(variant):
    torch.manual_seed(0)
    ours = cli_model([f"model.variant={variant}"])
    torch.manual_seed(0)
    lib = MODELS[variant](in_channels=1, num_classes=10, grid=(32, 32))
    assert ours.config == lib.config
    a, b = ours.state_dict(), lib.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 32, 32, 1)
    ours.eval(), lib.eval()
    torch.testing.assert_close(ours(x), lib(x))


def test_given_model_keys_keep_their_values():
    model = cli_model(["model.variant=RelativePerformer", "model.dim=64", "model.patch_size=2", "model.heads=2"])
    cfg = model.config
    assert (cfg.dim, cfg.patch_size, cfg.heads) == (64, 2, 2)
    assert (cfg.depth, cfg.norm, cfg.pooling, cfg.attention) == (4, "pre", "cls", "relative_favor")


def test_a_contradicting_attention_is_an_error(capsys):
    assert cli_helpers.main(["-Dmodel.variant=Performer", "-Dmodel.attention=relpos", "-no_wandb=T"]) == 2
    assert "model.variant=Performer uses model.attention=favor" in capsys.readouterr().err


def test_sweep_parameters_are_given_keys(tmp_path):
    """A sweep that sets model.variant applies the recipe to every key it does not set itself."""
    path = tmp_path / "s.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "method": "grid",
                "metric": {"name": "val/best_acc", "goal": "maximize"},
                "parameters": {
                    "model.variant": {"values": ["Performer", "ClippedRelativePerformer"]},
                    "model.dim": {"value": 32},
                },
            }
        )
    )
    seen = []

    def fake_train(cfg, epoch_callback=None):
        seen.append(cfg["model"])
        return {"history": [{"val/best_acc": 0.5}], "val/best_acc": 0.5}

    cfg = cli_helpers.load_config(["no_wandb=true", f"out_dir={tmp_path}", "model.depth=2"])
    sweep_mod.local_sweep(cfg, str(path), cli_helpers.defaults_flat(), train_fn=fake_train, given={"model.depth"})
    assert [m["attention"] for m in seen] == ["favor", "clipped_relative"]
    assert all(m["dim"] == 32 and m["depth"] == 2 and m["heads"] == 4 and m["patch_size"] == 1 for m in seen)


def test_thesis_keys_count_as_given():
    """The thesis' num_layers stands for model.depth: the recipe keeps it."""
    cfg = cli_model(["model.variant=Performer", "num_layers=2"]).config
    assert cfg.depth == 2 and cfg.dim == 128


def test_configs_saved_before_the_recipe_rebuild_their_models():
    """A config saved before performer.clipped_form existed: the window form of strategy 2 and the
    structural settings the variant forced then."""
    given: set = set()
    cfg = cli_helpers._load_config(cli_helpers.defaults(), None, ["model.variant=ClippedRelativePerformer"], given)
    del cfg["performer"]["clipped_form"]  # as saved then: no recipe applied, post-LN defaults
    model = build_model(upgrade_saved_config(cfg), splits())
    assert type(model.blocks[0].attention).__name__ == "ClippedWindowAttention"
    assert (model.config.norm, model.config.pooling, model.config.head) == ("pre", "cls", "linear")
    fresh = cli_helpers.load_config(["model.variant=ClippedRelativePerformer"])
    assert upgrade_saved_config(dict(fresh))["performer"]["clipped_form"] == "paper"


def test_resume_cannot_change_the_variant(tmp_path, capsys):
    tiny = [
        "-no_wandb=T",
        f"-Dout_dir={tmp_path}",
        "-Dname=r",
        "-Ddata.small_dataset=64",
        "-Dmodel.dim=16",
        "-Dmodel.depth=1",
        "-Dmodel.ffn_dim=16",
        "-Dmodel.patch_size=4",
        "-Dtrain.epochs=1",
    ]
    assert cli_helpers.main([*tiny, "-Dmodel.variant=NoPosPerformer"]) == 0
    assert cli_helpers.main([*tiny, "--resume", "-Dmodel.variant=Performer", "-Dtrain.epochs=2"]) == 2
    assert "model.variant cannot change in a resumed run" in capsys.readouterr().err
