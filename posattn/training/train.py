"""Training, evaluation and checkpoints for the experiment CLI."""

from __future__ import annotations

import math
import os
import random
import time
from typing import Callable, Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..nn import ModelConfig, TransformerClassifier
from ..nn.performer import PERFORMER_DEFAULTS, PERFORMER_VARIANTS
from .checkpoints import CheckpointStore
from .data import Splits, batches
from .tracking import Tracker
from .varres import PackedBatch, VariableResolution

__all__ = [
    "build_model",
    "model_config",
    "apply_model_variant",
    "upgrade_saved_config",
    "Trainer",
    "resolve_device",
    "set_seed",
    "Distributed",
]

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "warmup_cosine", "noam")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r} requested but CUDA is not available on this machine (set device to auto "
            "or cpu: -Ddevice=auto, or in the sweep file where a sweep sets it)"
        )
    return device


def apply_model_variant(cfg: dict, given: Iterable[str] = ()) -> dict:
    """``cfg`` with the recipe of ``model.variant`` (a Horn et al. model) applied in place:
    its attention and positional encoding, and every model setting of
    ``posattn.nn.<variant>()`` (dim 128, depth 4, heads 4, pre-LN, ...) except those
    ``given`` names (the keys a config file, a -D override or a sweep set), so that
    ``-Dmodel.variant=Performer`` and ``posattn.nn.Performer()`` build the same model.
    A given attention or encoding that contradicts the variant is a ValueError."""
    variant = cfg["model"].get("variant")
    if not variant:
        return cfg
    if variant not in PERFORMER_VARIANTS:
        raise ValueError(f"model.variant must be null or one of {', '.join(PERFORMER_VARIANTS)}; got {variant!r}")
    given = set(given)
    spec = PERFORMER_VARIANTS[variant]
    for key, value in (("model.attention", spec["attention"]), ("positional_encoding", spec["pe"]["name"])):
        section, _, name = key.rpartition(".")
        node = cfg[section] if section else cfg
        if key in given and node[name] != value:
            raise ValueError(
                f"model.variant={variant} uses {key}={value}, but {key}={node[name]!r} was given; drop one of them"
            )
        node[name] = value
    for key, value in PERFORMER_DEFAULTS.items():
        if f"model.{key}" not in given:
            cfg["model"][key] = value
    return cfg


def upgrade_saved_config(cfg: dict) -> dict:
    """A run config saved before ``performer.clipped_form`` existed (an earlier
    posattn) rebuilds the model it trained: strategy 2 in its window form and,
    for a ``model.variant``, the norm, activation, pooling and head the variant
    forced then. Changes ``cfg`` in place and returns it."""
    performer = cfg.setdefault("performer", {})
    if "clipped_form" not in performer:
        performer["clipped_form"] = "window"
        if (cfg.get("model") or {}).get("variant"):
            cfg["model"].update({k: PERFORMER_DEFAULTS[k] for k in ("norm", "activation", "pooling", "head")})
    return cfg


def model_config(cfg: dict, splits: Splits) -> ModelConfig:
    """The ModelConfig of an experiment config for the loaded data."""
    m = dict(cfg["model"])
    variant = m.pop("variant", None)
    for key, found in (("in_channels", splits.channels), ("num_classes", splits.num_classes)):
        if m.get(key) is not None and int(m[key]) != found:
            raise ValueError(
                f"model.{key} is {m[key]} but the data ({cfg['data']['name']}) has {found}; "
                f"leave model.{key} null to take it from the data"
            )
    values = dict(
        m,
        grid=list(splits.grid),
        in_channels=splits.channels,
        num_classes=splits.num_classes,
        pe=dict(cfg["pe"], name=cfg["positional_encoding"]),
        span=dict(cfg["span"]),
        performer=dict(cfg["performer"]),
    )
    if variant:
        if variant not in PERFORMER_VARIANTS:
            raise ValueError(f"model.variant must be null or one of {', '.join(PERFORMER_VARIANTS)}; got {variant!r}")
        spec = PERFORMER_VARIANTS[variant]  # the rest of the recipe: apply_model_variant, when the config was resolved
        values["attention"] = spec["attention"]
        values["pe"]["name"] = spec["pe"]["name"]
    return ModelConfig.from_dict(values)


def build_model(cfg: dict, splits: Splits) -> TransformerClassifier:
    return TransformerClassifier(model_config(cfg, splits))


class Distributed:
    """torchrun's process group (DistributedDataParallel), or a single process."""

    def __init__(self):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.active = self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def init(self, device: torch.device) -> None:
        if self.active and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def device(self, requested: torch.device) -> torch.device:
        if self.active and requested.type == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return requested

    def sum(self, values: list[float], device) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    @staticmethod
    def close() -> None:
        """Ends torchrun's process group; every rank calls it after its last collective. A rank
        that exits with the group alive may abort at interpreter exit ("terminate called without
        an active exception", SIGABRT: gloo's threads outlive the interpreter; it happened in CI)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def lr_factor(schedule: str, step: int, warmup: int, total: int) -> float:
    """Multiplier of the base lr after ``step`` optimizer steps.

    constant: 1 (linear warmup first if warmup > 0); warmup_cosine: linear warmup,
    then cosine decay to 0 at ``total``; noam: min(step / warmup, sqrt(warmup / step))
    (Vaswani et al.'s schedule, scaled so that its peak is the base lr).
    """
    s = step + 1
    if schedule == "noam":
        w = max(warmup, 1)
        return min(s / w, math.sqrt(w / s))
    if warmup > 0 and s <= warmup:
        return s / warmup
    if schedule == "warmup_cosine":
        progress = (s - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


class Trainer:
    """Trains a classifier on in-memory splits; checkpoints every epoch.

    Files in ``run_dir`` (see :mod:`.checkpoints`): ``last.pt`` (every epoch),
    ``best.pt`` (best validation accuracy), ``manifest.json`` and ``metrics.jsonl``.
    Each epoch logs its metrics, then writes best.pt, then last.pt: whatever
    instant a kill lands on, resuming from the newest intact checkpoint trains the
    missing epochs again and rewrites what they wrote, identically.
    """

    def __init__(
        self,
        cfg: dict,
        splits: Splits,
        model: TransformerClassifier,
        device: torch.device,
        run_dir: str,
        tracker: Tracker,
        dist: Optional[Distributed] = None,
        progress: bool = True,
        store: Optional[CheckpointStore] = None,
    ):
        t = cfg["train"]
        if t["optimizer"] not in OPTIMIZERS:
            raise ValueError(f"train.optimizer must be one of {OPTIMIZERS}, got {t['optimizer']!r}")
        if t["schedule"] not in SCHEDULES:
            raise ValueError(f"train.schedule must be one of {SCHEDULES}, got {t['schedule']!r}")
        for key in ("epochs", "batch_size", "accumulation_steps", "eval_batch_size"):
            if int(t[key]) < 1:
                raise ValueError(f"train.{key} must be >= 1, got {t[key]}")
        self.cfg, self.t, self.splits, self.device, self.run_dir = cfg, t, splits, device, run_dir
        self.tracker, self.dist, self.progress = tracker, dist or Distributed(), progress
        self.store = store or CheckpointStore(run_dir)
        self.model = model.to(device)
        self.module = self.model  # unwrapped (for checkpoints and stats)
        if self.dist.active:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None
            )
        opt_cls = torch.optim.AdamW if t["optimizer"] == "adamw" else torch.optim.Adam
        self.optimizer = opt_cls(
            self.module.parameters(), lr=float(t["lr"]), betas=tuple(t["betas"]), weight_decay=float(t["weight_decay"])
        )
        self.varres = self._variable_resolution(cfg, splits)
        n_train = len(splits.train[1])
        per_rank = math.ceil(n_train / self.dist.world_size)
        micro_batches = math.ceil(per_rank / t["batch_size"])
        if self.varres is not None:  # packed batches: as many as a shuffled packing makes
            micro_batches = len(self.varres.train_batches(splits.train[1], torch.Generator().manual_seed(0)))
        self.steps_per_epoch = math.ceil(micro_batches / t["accumulation_steps"])
        total = self.steps_per_epoch * t["epochs"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(t["schedule"], step, int(t["warmup_steps"]), total)
        )
        self.shuffle = torch.Generator().manual_seed(int(cfg["seed"]))
        self.epoch, self.step, self.best_val_acc = 0, 0, -1.0

    def _variable_resolution(self, cfg: dict, splits: Splits) -> Optional[VariableResolution]:
        """data.resolution=variable: the packed images (None for fixed-size batches)."""
        d = cfg["data"]
        if d.get("resolution", "fixed") != "variable":
            return None
        if self.dist.active:
            raise ValueError("data.resolution=variable runs in one process (not under torchrun) for now")
        if d["sequential"]:
            raise ValueError("data.resolution=variable needs data.sequential=false (images, not sequences)")
        patch = int(cfg["model"]["patch_size"])
        lo, hi = int(d["min_side"]), int(d["max_side"])
        if not patch <= lo <= hi:
            raise ValueError(
                f"data.resolution=variable needs model.patch_size <= data.min_side <= data.max_side, got "
                f"{patch}, {lo}, {hi}"
            )
        return VariableResolution(
            splits.train[0], (lo, hi), patch, int(cfg["train"]["batch_size"]), int(d["token_budget"]),
            int(cfg["seed"] or 0),
        )  # fmt: skip

    def _logits(self, xb) -> torch.Tensor:
        """The model's logits of a batch: images (B, *grid, C), or a packed batch."""
        if isinstance(xb, PackedBatch):
            return self.module.forward_packed(xb.tokens.to(self.device), xb.grids.to(self.device))
        return self.model(xb.to(self.device))

    # --- checkpoints -----------------------------------------------------

    def state(self) -> dict:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "best_val_acc": self.best_val_acc,
            "shuffle_rng": self.shuffle.get_state(),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "config": self.cfg,
            "model_config": self.module.config.to_dict(),
        }

    def load_state(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.step, self.best_val_acc = state["epoch"], state["step"], state["best_val_acc"]
        self.shuffle.set_state(state["shuffle_rng"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])

    # --- evaluation ------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Mean loss and accuracy over (x, y) (sharded over ranks under torchrun)."""
        self.module.eval()
        loss_sum, correct, count = 0.0, 0.0, 0.0
        if self.varres is not None:
            split = self.varres.eval_batches(x, y)
        else:
            split = batches(x, y, self.t["eval_batch_size"], rank=self.dist.rank, world_size=self.dist.world_size)
        for xb, yb in split:
            yb = yb.to(self.device)
            logits = self.module(xb.to(self.device)) if not isinstance(xb, PackedBatch) else self._logits(xb)
            loss_sum += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += (logits.argmax(-1) == yb).sum().item()
            count += len(yb)
        loss_sum, correct, count = self.dist.sum([loss_sum, correct, count], self.device)
        return {"loss": loss_sum / max(count, 1), "acc": correct / max(count, 1)}

    # --- training --------------------------------------------------------

    def _epoch_groups(self):
        """The epoch's micro-batches in groups of accumulation_steps."""
        x, y = self.splits.train
        if self.varres is not None:
            micro = self.varres.train_batches(y, self.shuffle)
            k = self.t["accumulation_steps"]
            return [micro[i : i + k] for i in range(0, len(micro), k)]
        micro = list(
            batches(
                x,
                y,
                self.t["batch_size"],
                shuffle=True,
                generator=self.shuffle,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
            )
        )
        k = self.t["accumulation_steps"]
        return [micro[i : i + k] for i in range(0, len(micro), k)]

    def train_epoch(self) -> dict:
        self.model.train()
        groups = self._epoch_groups()
        n_samples = sum(len(yb) for g in groups for _, yb in g)
        bar = tqdm(
            total=n_samples,
            desc=f"epoch {self.epoch + 1}/{self.t['epochs']}",
            unit="img",
            disable=None if (self.progress and self.dist.is_main) else True,
            leave=False,
            mininterval=1.0,
        )
        loss_sum, correct, seen = 0.0, 0, 0
        start = time.perf_counter()
        for group in groups:
            # Each micro-batch's summed loss is divided by the group's sample count, so the
            # accumulated gradient is that of the mean over the whole group (also for a
            # short last group).
            group_size = sum(len(yb) for _, yb in group)
            self.optimizer.zero_grad(set_to_none=True)
            for xb, yb in group:
                yb = yb.to(self.device)
                logits = self._logits(xb)
                loss = F.cross_entropy(logits, yb, reduction="sum")
                objective = loss / group_size
                penalty = self.module.span_penalty()  # span.penalty: once per step over the group
                if penalty is not None:
                    objective = objective + penalty * (len(yb) / group_size)
                objective.backward()
                loss_sum += loss.item()
                correct += (logits.argmax(-1) == yb).sum().item()
                seen += len(yb)
                elapsed = time.perf_counter() - start
                bar.update(len(yb))
                bar.set_postfix(loss=f"{loss_sum / seen:.4f}", img_s=f"{seen / max(elapsed, 1e-9):.0f}")
            if self.t["grad_clip"] and self.t["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), float(self.t["grad_clip"]))
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        bar.close()
        seconds = time.perf_counter() - start
        loss_sum, correct, seen = self.dist.sum([loss_sum, float(correct), float(seen)], self.device)
        return {
            "loss": loss_sum / max(seen, 1),
            "acc": correct / max(seen, 1),
            "seconds": seconds,
            "per_sample_ms": 1e3 * seconds * self.dist.world_size / max(seen, 1),
            "per_step_ms": 1e3 * seconds / max(len(groups), 1),
        }

    def span_metrics(self) -> dict:
        """Per-layer mean sigma and box size per axis, and kept-key fraction."""
        out = {}
        for key, value in self.module.span_stats().items():
            layer, name = key.split("/")
            if name == "keep_fraction":
                out[f"span/{layer}/keep_fraction"] = value
                continue
            columns = list(zip(*value))  # per axis, over heads
            for d, col in enumerate(columns):
                out[f"span/{layer}/{name}_axis{d}"] = float(sum(col) / len(col))
        return out

    def fit(self, epoch_callback: Optional[Callable[[int, dict], bool]] = None) -> dict:
        """Trains the remaining epochs. ``epoch_callback(epoch, metrics)`` returning
        True stops early (used by hyperband in local sweeps)."""
        history = []
        while self.epoch < self.t["epochs"]:
            train = self.train_epoch()
            val = self.evaluate(*self.splits.val)
            self.epoch += 1
            metrics = {
                "epoch": self.epoch,
                "train/loss": train["loss"],
                "train/acc": train["acc"],
                "val/loss": val["loss"],
                "val/acc": val["acc"],
                "lr": self.scheduler.get_last_lr()[0],
                "time/per_sample_ms": train["per_sample_ms"],
                "time/per_step_ms": train["per_step_ms"],
                "time/epoch_s": train["seconds"],
                **self.span_metrics(),
            }
            improved = val["acc"] > self.best_val_acc
            if improved:
                self.best_val_acc = val["acc"]
            metrics["val/best_acc"] = self.best_val_acc
            if self.dist.is_main:
                # This order keeps every state on disk resumable (class docstring).
                self.tracker.log(metrics, step=self.epoch)
                state = self.state()
                if improved:
                    self.store.save("best", state)
                self.store.save("last", state)
                print(
                    f"epoch {self.epoch}/{self.t['epochs']}: train loss {train['loss']:.4f} acc {train['acc']:.4f} | "
                    f"val loss {val['loss']:.4f} acc {val['acc']:.4f} | {train['per_sample_ms']:.2f} ms/sample"
                    f"{' (best)' if improved else ''}",
                    flush=True,
                )
            self.dist.barrier()
            history.append(metrics)
            if epoch_callback is not None and epoch_callback(self.epoch, metrics):
                print(f"stopped early after epoch {self.epoch}", flush=True)
                break
        return {"history": history, "best_val_acc": self.best_val_acc}
