"""The thesis' configuration vocabulary, as one table.

M. Alfons' code (github.com/MeenaAlfons/posattn) configures runs with flat keys
(``config.yaml`` and ``experiments/sweeps/*.yaml``): ``learning_rate``,
``num_layers``, ``apply_positional_mask``, ``sigma.default``, ... Every such key
is accepted wherever a posattn setting has its meaning: :data:`THESIS_KEYS` says
what each one becomes. A key that configures nothing here (``channels_last``,
``hooks``, ...) is accepted and reported once; a value posattn cannot honour
(a feature it lacks) is a :class:`ConfigError` naming the key and why.

``lookup(key).translate(key, raw)`` gives the posattn assignments of one thesis
key, None for a key that configures nothing, or raises ConfigError.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .values import ConfigError, parse_bool, parse_yaml

__all__ = ["ThesisKey", "THESIS_KEYS", "lookup", "thesis_key_names"]

Translation = Optional[dict]  # {posattn key: raw value}; {} = honoured as is; None = configures nothing


@dataclass(frozen=True)
class ThesisKey:
    """One key of the thesis' config; ``layer_N`` in ``key`` stands for any layer index."""

    key: str
    posattn: str  # what it becomes here (the documentation's table, docs/reference/thesis_keys.md)
    convert: Callable[[Any], Translation]

    def matches(self, key: str) -> bool:
        return re.fullmatch(re.escape(self.key).replace("layer_N", r"layer_\d+"), key) is not None

    def translate(self, key: str, raw: Any) -> Translation:
        """posattn's assignments for ``key`` (a key this entry matches) = ``raw``:
        {posattn key: raw value} ({} when the value is honoured as it is), or None
        when the key configures nothing. Raises ConfigError naming the key when
        posattn cannot honour the value."""
        try:
            return self.convert(raw)
        except ConfigError as e:
            raise ConfigError(f"{key}={raw!r}: {e}") from None


# --- conversions ----------------------------------------------------------------


def _to(*targets: str) -> Callable[[Any], Translation]:
    """The same value under posattn's key(s); the target's type checks it."""
    return lambda raw: {t: raw for t in targets}


def _refuse(why: str):
    raise ConfigError(why)


def _only(*allowed: str, why: str, result: Translation) -> Callable[[Any], Translation]:
    """``result`` for the allowed values (``{}``: honoured as is; None: configures
    nothing), else a ConfigError saying why."""
    return lambda raw: result if parse_yaml(raw) in allowed else _refuse(why)


def _true_only(why: str, result: Translation) -> Callable[[Any], Translation]:
    """A switch posattn always has on: ``result`` for true, a ConfigError for false."""
    return lambda raw: result if parse_bool(raw) else _refuse(why)


def _flag_off(why: str) -> Callable[[Any], Translation]:
    """A feature posattn does not have: false configures nothing, true is refused."""
    return lambda raw: _refuse(why) if parse_bool(raw) else None


def _ignored(raw: Any) -> Translation:
    return None


def _no_override(what: str) -> Callable[[Any], Translation]:
    """The thesis' per-layer overrides: a value <= 0 means "no override"."""

    def convert(raw):
        value = parse_yaml(raw)
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0):
            return {}
        raise ConfigError(f"posattn has one {what} for all layers; only values <= 0 (no override) are accepted")

    return convert


def _dataset(raw: Any) -> Translation:
    name = str(parse_yaml(raw))
    if name == "smnist":  # the thesis' sequential MNIST: the 784 pixels as a sequence
        return {"data.name": "mnist", "data.sequential": True}
    if name in ("mnist", "cifar10", "fashion_mnist"):
        return {"data.name": name, "data.sequential": False}
    raise ConfigError("expected cifar10, mnist or smnist (or posattn's fashion_mnist)")


def _small_dataset(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if isinstance(value, str):
        value = parse_bool(value)
    if isinstance(value, bool):  # the thesis: True keeps min(1000, 10%) of the training images
        return {"data.small_dataset": 1000 if value else 0}
    return {"data.small_dataset": raw}


def _scheduler(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if value in ("", None):
        return {"train.schedule": "constant", "train.warmup_steps": 0}
    raise ConfigError(
        "torch schedulers by name are not available; use train.schedule "
        "(constant, warmup_cosine or noam) with train.warmup_steps"
    )


def _include_position(raw: Any) -> Translation:
    return {} if parse_bool(raw) else {"positional_encoding": "none"}


def _threshold(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError("expected a number (-1: no threshold)")
    return {"span.threshold": float(value) if value > 0 else 0.0}


def _mask_with(raw: Any) -> Translation:
    if parse_yaml(raw) == "all_logits":
        return {"span.mode": "multiply"}
    raise ConfigError(
        "posattn applies the Gaussian to all logits (all_logits, span.mode multiply) or adds its "
        "log to them (span.mode add); positional_logits alone is not available"
    )


def _pooling(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if value in ("last", "mean", "max"):
        return {"model.pooling": value}
    raise ConfigError("expected last, mean or max")


def _resolution_reduction(raw: Any) -> Translation:
    value = parse_yaml(raw)
    flags = value if isinstance(value, list) else [value]
    if all(not parse_bool(v) for v in flags):
        return {}
    raise ConfigError(
        "resolution reduction (pooling the grid between layers) is not available; "
        "use model.patch_size for a coarser token grid"
    )


def _pe_layers(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError("expected an int >= 2 (sine layers plus the final linear layer)")
    return {"pe.hidden_layers": value - 1}


def _positional_dims(raw: Any) -> Translation:
    value = parse_yaml(raw)
    if value == 1:
        return {"model.positions": "sequence"}
    if value == 2:
        return {"model.positions": "grid"}
    raise ConfigError("expected 1 (positions along the flattened image) or 2 (positions on the image grid)")


def _positional_encoding(raw: Any) -> Translation:
    names = {"implicit": "siren", "baseline": "sinusoidal"}
    value = parse_yaml(raw)
    return {"positional_encoding": names.get(value, raw)}


# The thesis' keys, in the order of its config.yaml. The three it shares with
# posattn (device, positional_encoding, pe.hidden_dim) are here too, so that the
# table documents every key.
THESIS_KEYS: tuple[ThesisKey, ...] = (
    ThesisKey(
        "model",
        "`positional_transformer_classifier` only: the model posattn builds",
        _only(
            "positional_transformer_classifier",
            result={},
            why="posattn builds the thesis' transformer "
            "classifier (positional_transformer_classifier) only; model.variant selects Horn et al.'s models",
        ),
    ),
    ThesisKey(
        "dataset", "`data.name` (`cifar10`, `mnist`); `smnist` is `mnist` with `data.sequential: true`", _dataset
    ),
    ThesisKey("device", "`device` (`cpu`, `cuda`, `cuda:N`; posattn also takes `auto`)", _to("device")),
    ThesisKey("random_state", "`seed` (null: a random seed, printed and saved with the run)", _to("seed")),
    ThesisKey("num_epochs", "`train.epochs`", _to("train.epochs")),
    ThesisKey(
        "small_dataset", "`data.small_dataset`: true keeps 1000 training images, false all of them", _small_dataset
    ),
    ThesisKey("batch_size", "`train.batch_size`", _to("train.batch_size")),
    ThesisKey(
        "channels_last",
        "configures nothing: images are always channels-last (B, H, W, C); false is refused",
        _true_only("posattn's loaders give channels-last images only", result=None),
    ),
    ThesisKey(
        "profile",
        "configures nothing; true is refused (no profiler; see benchmarks/)",
        _flag_off("no profiler is built in; time runs with benchmarks/ or torch.profiler"),
    ),
    ThesisKey(
        "positional_attention_version",
        "configures nothing: `v1`, `v2`, `v3` compute the same attention, which posattn's operator computes",
        _only("v1", "v2", "v3", why="expected v1, v2 or v3", result=None),
    ),
    ThesisKey("num_classes", "`model.num_classes` (checked against the data)", _to("model.num_classes")),
    ThesisKey("learning_rate", "`train.lr`", _to("train.lr")),
    ThesisKey("accumulation_steps", "`train.accumulation_steps`", _to("train.accumulation_steps")),
    ThesisKey(
        "scheduler",
        '`""` (none): `train.schedule: constant`, `train.warmup_steps: 0`; a torch scheduler name is refused',
        _scheduler,
    ),
    ThesisKey("scheduler_params", "configures nothing (no torch scheduler by name)", _ignored),
    ThesisKey("input_dim", "`model.in_channels` (checked against the data)", _to("model.in_channels")),
    ThesisKey("num_layers", "`model.depth`", _to("model.depth")),
    ThesisKey("model_dim", "`model.dim`", _to("model.dim")),
    ThesisKey("num_heads", "`model.heads`", _to("model.heads")),
    ThesisKey("dim_feedforward", "`model.ffn_dim`", _to("model.ffn_dim")),
    ThesisKey("dropout", "`model.dropout` and `model.input_dropout`", _to("model.dropout", "model.input_dropout")),
    ThesisKey(
        "positional_encoding",
        "`implicit` is `siren`, `baseline` is `sinusoidal`; posattn's names too",
        _positional_encoding,
    ),
    ThesisKey(
        "positional_logits_operation",
        "`add` only (content and positional logits are summed)",
        _only(
            "add",
            result={},
            why="posattn adds the positional logits to the content logits (add); multiply is not available",
        ),
    ),
    ThesisKey("include_position", "false: `positional_encoding: none`", _include_position),
    ThesisKey("same_positional_encoding", "`pe.shared`", _to("pe.shared")),
    ThesisKey("causal", "`model.causal`", _to("model.causal")),
    ThesisKey("apply_positional_mask", "`span.enabled`", _to("span.enabled")),
    ThesisKey("positional_mask_threshold", "`span.threshold`; -1 (any value <= 0) is no threshold", _threshold),
    ThesisKey(
        "multiply_positional_mask_with",
        "`all_logits`: `span.mode: multiply`; `positional_logits` is refused",
        _mask_with,
    ),
    ThesisKey("sigma.default", "`span.init`", _to("span.init")),
    ThesisKey("sigma.layer_N", "values <= 0 (no per-layer override) only", _no_override("initial sigma")),
    ThesisKey("learn_sigma", "`span.learnable`", _to("span.learnable")),
    ThesisKey("cls_token", "`model.pooling` (`last`, `mean`, `max`)", _pooling),
    ThesisKey("resolution_reduction", "all false only (no pooling between layers)", _resolution_reduction),
    ThesisKey("resolution_reduction_kernel_size", "configures nothing (no resolution reduction)", _ignored),
    ThesisKey("pe.num_layers", "`pe.hidden_layers` + 1 (the sine layers and the final linear layer)", _pe_layers),
    ThesisKey(
        "pe.hidden_dim",
        "`pe.hidden_dim` (the SIREN width; the baseline's feature count is `pe.num_features`)",
        _to("pe.hidden_dim"),
    ),
    ThesisKey("pe.num_positional_dims", "`model.positions`: 1 is `sequence`, 2 is `grid`", _positional_dims),
    ThesisKey(
        "pe.activation",
        "`Sine` only (SIREN)",
        _only(
            "Sine", result={}, why="posattn's implicit encoder is a SIREN (Sine); other activations are not available"
        ),
    ),
    ThesisKey(
        "pe.final_activation",
        "`Identity` only",
        _only(
            "Identity",
            result={},
            why="the SIREN's last layer is linear (Identity); other activations are not available",
        ),
    ),
    ThesisKey(
        "pe.normalized",
        "true only (offsets are normalised to [-1, 1])",
        _true_only("posattn's SIREN always reads offsets normalised to [-1, 1]", result={}),
    ),
    ThesisKey("pe.activation_params.w0", "`pe.w0`", _to("pe.w0")),
    ThesisKey("pe.activation_params.w0_initial", "values <= 0 (the first layer uses `pe.w0`) only", _no_override("w0")),
    ThesisKey("pe.activation_params.layer_N.w0", "values <= 0 (no per-layer override) only", _no_override("w0")),
    ThesisKey(
        "pe.activation_params.layer_N.w0_initial", "values <= 0 (no per-layer override) only", _no_override("w0")
    ),
    ThesisKey("hooks", "configures nothing (span statistics are logged every epoch)", _ignored),
    ThesisKey(
        "show_visuals",
        "configures nothing; true is refused (plots are written to files)",
        _flag_off("no interactive plots; posattn writes its plots to files"),
    ),
    ThesisKey("model_dir", "configures nothing: a run writes `<out_dir>/<name>/`", _ignored),
    ThesisKey("checkpoint_path", "configures nothing: checkpoints are `<out_dir>/<name>/last.pt`, `best.pt`", _ignored),
    ThesisKey("epoch_checkpoint_dir", "configures nothing (see `checkpoint_path`)", _ignored),
    ThesisKey("logs_dir", "configures nothing: metrics go to `<out_dir>/<name>/metrics.jsonl`", _ignored),
    ThesisKey("save_every_epochs", "configures nothing: `last.pt` is written every epoch", _ignored),
    ThesisKey("model_filename_pt", "configures nothing (see `checkpoint_path`)", _ignored),
    ThesisKey("model_filename_onnx", "configures nothing (no ONNX export)", _ignored),
    ThesisKey(
        "save_onnx",
        "configures nothing; true is refused (no ONNX export)",
        _flag_off("no ONNX export; the model is saved in <out_dir>/<name>/best.pt"),
    ),
    ThesisKey("log_times_per_epoch", "configures nothing (a progress bar shows the epoch)", _ignored),
)


def lookup(key: str) -> Optional[ThesisKey]:
    """The thesis key ``key`` matches, or None."""
    for entry in THESIS_KEYS:
        if entry.matches(key):
            return entry
    return None


def thesis_key_names() -> list[str]:
    """The thesis keys (with a layer index 0 for the per-layer ones), for close-match hints."""
    return [e.key.replace("layer_N", "layer_0") for e in THESIS_KEYS]
