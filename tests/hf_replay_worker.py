"""mp.spawn worker of tests/test_hf_llama.py: one rank of the replay path from a Hugging Face checkpoint.
Kept apart from the test module so the 4 spawned processes do not import transformers."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from helpers import init_gloo

from hydraplan.runtime import hf
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.device import Device
from hydraplan.runtime.groups import exit_process
from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.replay import Replayer


def replay_gradients(rank: int, world: int, port: int, folder: str, plans: list, out: str) -> None:
    """Each plan: Replayer.step from the HF weights with the optimizer step replaced by a capture; rank 0
    saves [(loss, canonical flat gradients)] to `out`. The weights stay the HF ones for every plan."""
    init_gloo(rank, world, port)
    ckpt = hf.Checkpoint(folder)
    replayer = Replayer(ckpt.cfg, TokenData(ckpt.cfg.vocab), torch.float64, 0, 1e-3, Device(),
                        timedelta(seconds=60))
    lo, hi = owner_ranges(replayer.numels, world)
    replayer.master.load(ckpt.shard(lo[rank], hi[rank], torch.float64))
    offsets = [np.concatenate(([0], np.cumsum(hi[r] - lo[r]))) for r in range(world)]
    results = []
    for plan in plans:
        grads: list[torch.Tensor] = []
        replayer.master.step = grads.append  # the owners' summed gradient shards
        loss = replayer.step(plan).loss
        shards: list = [None] * world
        dist.all_gather_object(shards, grads[0])
        results.append((loss, [torch.cat([shards[r][offsets[r][i]:offsets[r][i + 1]] for r in range(world)])
                               for i in range(len(lo[0]))]))
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()
    exit_process(0)
