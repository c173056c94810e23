"""A run folder's checkpoints, safe against a kill at any instruction.

Files in the run folder:

- ``manifest.json``: the run's config and, per checkpoint, the SHA-256 of the
  bytes it may hold. It is rewritten (atomically) before and after each
  checkpoint write, so that it lists both the old and the new hash while the
  checkpoint is being replaced: whatever instant a kill lands on, the file on
  disk is intact and listed, or damaged and detected.
- ``last.pt`` (every epoch) and ``best.pt`` (best validation accuracy): full
  training states, written to a temporary file, fsynced, then renamed.
- ``.tmp-*`` files are the leftovers of killed writes; :meth:`clean` removes them.

A damaged checkpoint (truncated, flipped bytes, not a checkpoint at all) raises
:class:`CheckpointError` with what is wrong; :meth:`load_resumable` then falls
back to the newest intact one.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import tempfile
from typing import Optional

import torch

__all__ = ["CheckpointError", "CheckpointStore", "write_atomic", "load_checkpoint_file", "MANIFEST"]

MANIFEST = "manifest.json"
TAGS = ("last", "best")  # newest first
# Keys every training state holds (Trainer.state); anything else is not a posattn checkpoint.
STATE_KEYS = ("model", "optimizer", "epoch", "best_val_acc", "config")


class CheckpointError(Exception):
    """A checkpoint that is missing, damaged or not a posattn checkpoint."""


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to a temporary file in ``path``'s folder, fsyncs it, then
    renames it over ``path``: a kill leaves the old file or the new one, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Makes a rename durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _serialise(state: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parse(data: bytes, path: str) -> dict:
    """The training state in ``data``, or CheckpointError saying why it is none."""
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as e:  # truncated, random or foreign bytes: torch/pickle raise many types
        raise CheckpointError(
            f"{path} is not a readable posattn checkpoint ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else 'no detail'})"
        ) from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path} is not a posattn checkpoint (it lacks {', '.join(missing)})")
    return state


def load_checkpoint_file(path: str) -> dict:
    """Loads a checkpoint, checked against its run folder's manifest when it has one."""
    directory, name = os.path.split(os.path.abspath(path))
    tag = name[:-3] if name.endswith(".pt") else None
    store = CheckpointStore(directory)
    if tag in TAGS and os.path.exists(store.manifest_path):
        return store.load(tag)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        return _parse(f.read(), path)


class CheckpointStore:
    """The checkpoints and manifest of one run folder (see the module docstring)."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.manifest_path = os.path.join(run_dir, MANIFEST)

    def path(self, tag: str) -> str:
        return os.path.join(self.run_dir, f"{tag}.pt")

    # --- manifest ------------------------------------------------------------

    def manifest(self) -> Optional[dict]:
        """The manifest, or None for a run folder without one (written before manifests existed)."""
        if not os.path.exists(self.manifest_path):
            return None
        try:
            with open(self.manifest_path) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.manifest_path} is damaged ({type(e).__name__}: {e})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("checkpoints"), dict):
            raise CheckpointError(f"{self.manifest_path} is not a posattn run manifest")
        return manifest

    def _write_manifest(self, manifest: dict) -> None:
        write_atomic(self.manifest_path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())

    def start(self, config: dict, fresh: bool) -> None:
        """Records the run's config: a fresh run starts a new manifest (checkpoints
        of an earlier run in the folder are no longer listed); a resumed run keeps
        its checkpoints' hashes and records the config it goes on with."""
        manifest = None if fresh else self.manifest()
        manifest = manifest or {"format": 1, "checkpoints": {}}
        manifest["config"] = config
        self._write_manifest(manifest)

    def config(self) -> Optional[dict]:
        manifest = self.manifest()
        return manifest.get("config") if manifest else None

    def clean(self) -> list[str]:
        """Removes the temporary files of killed writes; returns their names."""
        removed = []
        for tmp in glob.glob(os.path.join(glob.escape(self.run_dir), ".tmp-*")):
            try:
                os.unlink(tmp)
                removed.append(os.path.basename(tmp))
            except FileNotFoundError:
                pass
        return removed

    # --- checkpoints ---------------------------------------------------------

    def save(self, tag: str, state: dict) -> None:
        """Writes ``<tag>.pt``. The manifest lists the old and the new hash while
        the file is replaced, then only the new one."""
        data = _serialise(state)
        digest = _digest(data)
        manifest = self.manifest() or {"format": 1, "checkpoints": {}}
        listed = manifest["checkpoints"].get(tag, {}).get("sha256", [])
        keep = []  # the hash of the intact file on disk, which stays valid until the rename
        if os.path.isfile(self.path(tag)):
            with open(self.path(tag), "rb") as f:
                on_disk = _digest(f.read())
            keep = [on_disk] if on_disk in listed and on_disk != digest else []
        manifest["checkpoints"][tag] = {"sha256": [digest] + keep, "epoch": state.get("epoch")}
        self._write_manifest(manifest)
        write_atomic(self.path(tag), data)
        manifest["checkpoints"][tag]["sha256"] = [digest]
        self._write_manifest(manifest)

    def load(self, tag: str) -> dict:
        """``<tag>.pt``, verified against the manifest; CheckpointError if missing or damaged."""
        path = self.path(tag)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path} does not exist")
        with open(path, "rb") as f:
            data = f.read()
        manifest = self.manifest()
        if manifest is not None:
            listed = manifest["checkpoints"].get(tag, {}).get("sha256", [])
            if _digest(data) not in listed:
                raise CheckpointError(
                    f"{path} is damaged: its SHA-256 is not the one {MANIFEST} recorded "
                    f"({len(data):,} bytes; truncated, overwritten or altered on disk)"
                )
        return _parse(data, path)

    def load_resumable(self, log=print) -> tuple[Optional[dict], Optional[str]]:
        """The newest intact checkpoint (last.pt, else best.pt) and its tag; (None,
        None) when there is none. Each damaged or missing one is reported with ``log``."""
        for tag in TAGS:
            try:
                return self.load(tag), tag
            except CheckpointError as e:
                if os.path.exists(self.path(tag)) or tag == "last":
                    log(f"resume: {e}")
        return None, None
