"""Image datasets held in memory, seeded splits, batches, and the shifted-image set.

Images are float tensors (N, H, W, C) standardised with the training set's
mean and std; labels int64. Sources, first found wins:

- fashion_mnist: the Debian package dataset-fashion-mnist
  (/usr/share/datasets/fashion-mnist), ``<root>/fashion_mnist``, or torchvision's download;
- mnist: ``<root>/mnist`` (IDX files, gzipped or not), or torchvision's download;
- cifar10: ``<root>/cifar-10-batches-py`` (the Python pickles), or torchvision's download.
"""

from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

__all__ = ["DATASETS", "DataError", "Splits", "load_splits", "batches", "shifted_images", "read_idx"]

DATASETS = ("fashion_mnist", "mnist", "cifar10")
DEBIAN_FASHION = "/usr/share/datasets/fashion-mnist"
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


class DataError(RuntimeError):
    """A dataset cannot be found or read; the message says how to get it."""


def read_idx(path: str) -> np.ndarray:
    """An IDX file (optionally .gz) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: expected {int(np.prod(dims))} values, found {arr.size}")
    return arr.reshape(dims)


def _find(directory: str, stem: str) -> Optional[str]:
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def _idx_split(directory: str, split: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    images, labels = (_find(directory, stem) for stem in IDX_FILES[split])
    if images is None or labels is None:
        return None
    return read_idx(images)[..., None], read_idx(labels).astype(np.int64)


def _cifar_split(directory: str, split: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    paths = [os.path.join(directory, n) for n in names]
    if not all(os.path.exists(p) for p in paths):
        return None
    xs, ys = [], []
    for p in paths:
        with open(p, "rb") as f:
            batch = pickle.load(f, encoding="latin1")
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(np.asarray(batch["labels"], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _torchvision_split(name: str, root: str, split: str):
    try:
        from torchvision import datasets
    except ImportError:
        return None
    cls = {"fashion_mnist": datasets.FashionMNIST, "mnist": datasets.MNIST, "cifar10": datasets.CIFAR10}[name]
    try:
        ds = cls(root=root, train=split == "train", download=True)
    except Exception as e:  # no network, or a broken download
        raise DataError(f"torchvision could not download {name} into {root!r}: {e}") from None
    x = np.asarray(ds.data)
    x = x[..., None] if x.ndim == 3 else x
    return x, np.asarray(ds.targets, dtype=np.int64)


def _instructions(name: str, root: str) -> str:
    if name == "fashion_mnist":
        return (
            "install the Debian package (`apt-get install dataset-fashion-mnist`, done by scripts/setup.sh), "
            f"or put the IDX files in {os.path.join(root, 'fashion_mnist')}"
        )
    if name == "mnist":
        return (
            f"put train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
            f"t10k-labels-idx1-ubyte.gz in {os.path.join(root, 'mnist')}, or install torchvision on a machine "
            "with network access so that it can download them"
        )
    return (
        f"extract cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) into {root} so that "
        f"{os.path.join(root, 'cifar-10-batches-py')} exists, or install torchvision on a machine with network "
        "access so that it can download it"
    )


def load_raw(name: str, root: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, H, W, C), labels int64) of ``split`` ("train" or "test")."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    found = None
    if name == "fashion_mnist":
        found = _idx_split(DEBIAN_FASHION, split) or _idx_split(os.path.join(root, "fashion_mnist"), split)
    elif name == "mnist":
        found = _idx_split(os.path.join(root, "mnist"), split)
    else:
        found = _cifar_split(os.path.join(root, "cifar-10-batches-py"), split)
    if found is None:
        found = _torchvision_split(name, root, split)
    if found is None:
        raise DataError(
            f"dataset {name!r} ({split}) not found and torchvision is not installed: " + _instructions(name, root)
        )
    return found


@dataclass
class Splits:
    """Standardised tensors of the three splits and what a model needs to know."""

    train: tuple[torch.Tensor, torch.Tensor]
    val: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    grid: list
    channels: int
    num_classes: int
    mean: list
    std: list

    def describe(self) -> str:
        return (
            f"train {len(self.train[1])}, val {len(self.val[1])}, test {len(self.test[1])} images; "
            f"grid {self.grid}, {self.channels} channel(s), {self.num_classes} classes"
        )


def prepare(images: np.ndarray, mean: np.ndarray, std: np.ndarray, pad_to: int, sequential: bool) -> torch.Tensor:
    """uint8 (N, H, W, C) -> standardised float32, optionally zero-padded (in raw pixel
    space, so the padding is 'empty') and flattened to (N, H*W, C)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    if pad_to:
        h, w = x.shape[1:3]
        if pad_to < max(h, w):
            raise DataError(f"data.pad_to ({pad_to}) is smaller than the images ({h}x{w})")
        top, left = (pad_to - h) // 2, (pad_to - w) // 2
        x = torch.nn.functional.pad(x, (0, 0, left, pad_to - w - left, top, pad_to - h - top))
    x = (x - torch.as_tensor(mean, dtype=torch.float32)) / torch.as_tensor(std, dtype=torch.float32)
    if sequential:
        x = x.reshape(x.shape[0], -1, x.shape[-1])
    return x.contiguous()


def load_splits(
    name: str,
    root: str = "data",
    val_fraction: float = 0.1,
    seed: int = 0,
    small_dataset: int = 0,
    pad_to: int = 0,
    sequential: bool = False,
) -> Splits:
    """Loads ``name``, splits its training set into train/val (seeded) and keeps the
    test set apart. ``small_dataset`` > 0 keeps that many training images (and the
    validation and test sets shrink in proportion)."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    if small_dataset < 0 or pad_to < 0:
        raise ValueError(
            f"data.small_dataset (0: all images) and data.pad_to (0: none) must be >= 0, got {small_dataset}, {pad_to}"
        )
    x_train, y_train = load_raw(name, root, "train")
    x_test, y_test = load_raw(name, root, "test")
    g = torch.Generator().manual_seed(int(seed))
    order = torch.randperm(len(y_train), generator=g).numpy()
    n_val = int(round(len(order) * val_fraction))
    val_idx, train_idx = order[:n_val], order[n_val:]
    test_idx = np.arange(len(y_test))
    if small_dataset:
        ratio = min(1.0, small_dataset / len(train_idx))
        train_idx = train_idx[: max(1, small_dataset)]
        val_idx = val_idx[: max(1, int(round(len(val_idx) * ratio)))]
        test_idx = torch.randperm(len(y_test), generator=g).numpy()[: max(1, int(round(len(y_test) * ratio)))]
    raw_train = x_train[train_idx].astype(np.float32) / 255.0
    mean = raw_train.mean(axis=(0, 1, 2))
    std = raw_train.std(axis=(0, 1, 2)) + 1e-6
    prep = lambda x: prepare(x, mean, std, pad_to, sequential)  # noqa: E731
    h, w = (pad_to, pad_to) if pad_to else x_train.shape[1:3]
    grid = [h * w] if sequential else [h, w]
    return Splits(
        train=(prep(x_train[train_idx]), torch.from_numpy(y_train[train_idx])),
        val=(prep(x_train[val_idx]), torch.from_numpy(y_train[val_idx])),
        test=(prep(x_test[test_idx]), torch.from_numpy(y_test[test_idx])),
        grid=grid,
        channels=int(x_train.shape[-1]),
        num_classes=int(max(y_train.max(), y_test.max()) + 1),
        mean=mean.tolist(),
        std=std.tolist(),
    )


def batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    shuffle: bool = False,
    generator: Optional[torch.Generator] = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of (x, y); with ``world_size`` > 1 each rank gets its own shard."""
    n = len(y)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    if world_size > 1:
        order = order[rank::world_size]
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]


def full_test_split(splits: Splits, name: str, root: str, pad_to: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every test image of ``name``, standardised with the training statistics of
    ``splits`` (a run trained on a subset, data.small_dataset, saw a shrunk test split)."""
    x, y = load_raw(name, root, "test")
    return prepare(x, np.asarray(splits.mean), np.asarray(splits.std), pad_to, False), torch.from_numpy(y)


def shifted_images(
    x: torch.Tensor, y: torch.Tensor, background: float, class_index: int, min_shift: int, shifts: list[int]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Horn et al.'s shifted-image test set: test images of ``class_index`` with at
    least ``min_shift`` empty columns on both sides, shifted horizontally by each
    of ``shifts`` pixels (the vacated columns are background). x: (N, H, W, C)."""
    if x.dim() != 4:
        raise DataError("the shift test needs 2-D images (data.sequential: false)")
    keep = y == class_index
    xs = x[keep]
    empty = (xs - background).abs().amax(dim=(1, 3)) < 1e-6  # (N, W): empty columns
    W = x.shape[2]
    left_ok = empty[:, :min_shift].all(dim=1) if min_shift > 0 else torch.ones(len(xs), dtype=torch.bool)
    right_ok = empty[:, W - min_shift :].all(dim=1) if min_shift > 0 else torch.ones(len(xs), dtype=torch.bool)
    xs = xs[left_ok & right_ok]
    labels = torch.full((len(xs),), class_index, dtype=torch.long)
    out = {}
    for s in shifts:
        shifted = torch.full_like(xs, background)
        if s >= 0:
            shifted[:, :, s:] = xs[:, :, : W - s]
        else:
            shifted[:, :, : W + s] = xs[:, :, -s:]
        out[s] = (shifted, labels)
    return out
