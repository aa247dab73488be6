"""mp.spawn worker of tests/test_run_plan.py's overlap test: one rank replays plans through Replayer.step and
records, on its own clock, when LNK exchanges were posted and waited for next to when its compute ran."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from helpers import init_gloo

from hydraplan.runtime import lnk_streams, replay
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.device import Device
from hydraplan.runtime.groups import exit_process
from hydraplan.runtime.model import ModelConfig
from hydraplan.runtime.replay import Replayer

# 8 layers, so a pp=2 stage holds four decoder layers: the orderings below have whole layers of compute
# between the events they compare, never a race between two hooks of one autograd node
DEEP = ModelConfig("deep", vocab=128, hidden=32, layers=8, heads=4, kv_heads=4, ffn=64)


def record(rank: int, world: int, port: int, plans: list, overlap: bool, out: str) -> None:
    """Rank 0 saves, per plan, every computing rank's events: the propagation window (run_1f1b), the forward
    starts and backward starts (gradient of its output) of the stage's lowest decoder layer, the stage's
    layer groups, and the LinkClock's posts and waits."""
    init_gloo(rank, world, port)
    clocks: list[lnk_streams.LinkClock] = []
    make_clock = lnk_streams.LinkClock
    lnk_streams.LinkClock = lambda *a: clocks.append(make_clock(*a)) or clocks[-1]
    events: dict = {}

    def entries(module):
        found = group_entries(module)
        low = module.layers[min(module.layers.keys(), key=int)]

        def forward_start(_mod, _args):
            events["forward"].append(time.time())

        def backward_start_on(_mod, _args, output):
            output.register_hook(lambda g: events["backward"].append(time.time()))

        low.register_forward_pre_hook(forward_start)
        low.register_forward_hook(backward_start_on)
        events["groups"] = [g for g, _ in found]
        events["low"] = int(min(module.layers.keys(), key=int)) + 1
        return found

    def timed_1f1b(*args, **kwargs):
        events["window"] = [time.time()]
        loss = run_1f1b(*args, **kwargs)
        events["window"].append(time.time())
        return loss

    group_entries, run_1f1b = replay.group_entries, replay.run_1f1b
    replay.group_entries, replay.run_1f1b = entries, timed_1f1b
    # every layer group may be in flight: what is checked here is when a group is waited for and posted, not the
    # bound on groups in flight (tests/test_lnk.py), whose waits for earlier groups' completions can push a post
    # past the compared event on a loaded machine
    replayer = Replayer(DEEP, TokenData(DEEP.vocab), torch.float64, 0, 1e-3, Device(), timedelta(seconds=60),
                        overlap=overlap, lnk_depth=(64, 64))
    results = []
    for plan in plans:
        events.clear()
        events.update(forward=[], backward=[])
        replayer.step(plan)
        clock = clocks[-1]
        mine = dict(events, posts=dict(clock.posts), waits=list(clock.waits)) if "window" in events else None
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        results.append(gathered)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()
    exit_process(0)
