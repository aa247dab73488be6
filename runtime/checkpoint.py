"""Sharded training checkpoints: each rank's fp32 (fp64) master shard, its AdamW state and the step.

A checkpoint folder holds one file per rank, shard_RRRRR_of_WWWWW.pt (torch.save of the rank's
`ShardedMaster.state()`), and manifest.json: the world size, the model config, the master dtype and the
last plan iteration trained. Every file is written atomically (temporary file, fsync, rename) and the
manifest last, after all ranks wrote their shards, so a folder with a manifest is complete. Every rank
creates the folder and writes the (identical) manifest, and resuming reads only the rank's own shard, so a
checkpoint works whether the folder is one shared filesystem or each node's local disk. The shards
are the optimizer owners' fixed ranges (runtime/lnk.py owner_ranges), which depend on the world size and
the model only, not on any plan's strategy: resuming needs the same two, and refuses otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.runtime.model import ModelConfig
from hydraplan.store.fileio import write_json

FORMAT = "hydraplan.checkpoint/v1"
MANIFEST = "manifest.json"


def shard_path(folder: Path, rank: int, world: int) -> Path:
    return folder / f"shard_{rank:05d}_of_{world:05d}.pt"


def _shape(cfg: ModelConfig) -> dict:
    """What must match to resume: every field but the name."""
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "name"}


def _atomic_save(obj: object, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(folder: str | Path, state: dict, cfg: ModelConfig, master_dtype: torch.dtype, iteration: int) -> None:
    """Write this rank's shard state (`ShardedMaster.state()`), then, once every rank has, the manifest.
    Collective over the default group."""
    folder = Path(folder)
    rank, world = dist.get_rank(), dist.get_world_size()
    folder.mkdir(parents=True, exist_ok=True)  # on every rank: nodes need not share a filesystem
    (folder / MANIFEST).unlink(missing_ok=True)  # incomplete until the new manifest is written
    dist.barrier()
    state = {"weights": state["weights"].cpu(), "optimizer": _to_cpu(state["optimizer"])}
    _atomic_save(state, shard_path(folder, rank, world))
    dist.barrier()
    write_json(folder / MANIFEST, {"format": FORMAT, "world_size": world, "model": dataclasses.asdict(cfg),
                                   "master_dtype": str(master_dtype).removeprefix("torch."), "iteration": iteration})
    dist.barrier()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def check(folder: str | Path, rank: int, world: int, cfg: ModelConfig, master_dtype: torch.dtype) -> int:
    """The last trained plan iteration of a checkpoint this run can resume; UserError (one line) if the
    folder is not a complete checkpoint (its manifest, or this rank's shard, is missing) or was saved with
    another world size, model or master dtype."""
    folder = Path(folder)
    src = f"--resume: {folder / MANIFEST}"
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise UserError(f"{src}: no such file (not a complete checkpoint)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{src}: cannot read: {e}") from None
    if m.get("format") != FORMAT:
        raise UserError(f"{src}: field format: {m.get('format')!r} is not {FORMAT!r}")
    if m.get("world_size") != world:
        raise UserError(f"{src}: field world_size: saved by {m.get('world_size')} ranks, this run has {world} "
                        "(the optimizer shards depend on it)")
    saved = {k: v for k, v in (m.get("model") or {}).items() if k != "name"}
    if saved != _shape(cfg):
        diff = sorted(k for k in set(saved) | set(_shape(cfg)) if saved.get(k) != _shape(cfg).get(k))
        raise UserError(f"{src}: field model: saved model differs from this run's {cfg.name} in "
                        + ", ".join(f"{k} ({saved.get(k)} vs {_shape(cfg).get(k)})" for k in diff))
    want = str(master_dtype).removeprefix("torch.")
    if m.get("master_dtype") != want:
        raise UserError(f"{src}: field master_dtype: {m.get('master_dtype')!r}, this run's masters are {want!r}")
    if not shard_path(folder, rank, world).exists():
        raise UserError(f"--resume: {shard_path(folder, rank, world)}: no such file")
    return int(m["iteration"])


def load(folder: str | Path, rank: int, world: int) -> dict:
    """This rank's saved shard state (after `check`)."""
    return torch.load(shard_path(Path(folder), rank, world), map_location="cpu", weights_only=True)
