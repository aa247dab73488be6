"""`install`: which of hydraplan's seams this Megatron has, each wired, and one line saying so.

A seam is a scheduler class Megatron looks up where it builds its data iterator, in
megatron.core.datasets.data_schedule:
- hybrid_cp: `BalancedCPScheduler`, which `HybridCPDataLoaderWrapper` builds (`--hybrid-context-parallel`,
  megatron-core 0.17-0.19 and Megatron-LM main). In a Megatron that has dynamic CP (Megatron-LM dev) the flag is
  deprecated into `--dynamic-context-parallel` and nothing builds the wrapper: the seam is there but unused;
- packing: the `dp_balanced` entry of `scheduler_map` (`--sequence-packing-scheduler dp_balanced`; main's map is
  keyed by `PackingSchedulerEnum`, dev's by the string);
- dynamic_cp: its `default_dynamic_cp` entry (`--dynamic-context-parallel`, Megatron-LM dev).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydraplan.core.errors import UserError
from hydraplan.integrations.megatron.dropins import drop_in, dynamic_cp_drop_in, packing_drop_in
from hydraplan.integrations.megatron.guard import say
from hydraplan.integrations.megatron.schedules import load

DATA_SCHEDULE = "megatron.core.datasets.data_schedule"
SEAMS = ("hybrid_cp", "packing", "dynamic_cp")
MAP_KEY = {"packing": "dp_balanced", "dynamic_cp": "default_dynamic_cp"}  # scheduler_map entries by seam
NAMED = {"hybrid_cp": "hybrid CP's BalancedCPScheduler", "packing": "dp_balanced", "dynamic_cp": "default_dynamic_cp"}


@dataclass(frozen=True)
class Seam:
    """One seam in this Megatron: `keys` of scheduler_map to replace (empty for hybrid CP, a class attribute);
    `unused` says why Megatron never reaches it, `absent` that this Megatron does not have it."""

    name: str
    keys: tuple[Any, ...] = ()
    unused: str = ""
    absent: str = ""


def _entries(scheduler_map: Any, value: str) -> tuple[Any, ...]:
    """scheduler_map's keys for `value`: the string, or an enum member whose value it is."""
    if scheduler_map is None:
        return ()
    return tuple(k for k in scheduler_map if k == value or getattr(k, "value", None) == value)


def seams_of(data_schedule: Any) -> dict[str, Seam]:
    """Every seam of hydraplan as this Megatron has it."""
    scheduler_map = getattr(data_schedule, "scheduler_map", None)
    dynamic = _entries(scheduler_map, MAP_KEY["dynamic_cp"])
    out = {}
    if not hasattr(data_schedule, "BalancedCPScheduler"):
        out["hybrid_cp"] = Seam("hybrid_cp", absent="this Megatron has no BalancedCPScheduler (megatron-core 0.17 "
                                                    "on has it)")
    elif dynamic:
        out["hybrid_cp"] = Seam("hybrid_cp", unused="this Megatron runs --hybrid-context-parallel as dynamic CP "
                                                    "(default_dynamic_cp): nothing builds HybridCPDataLoaderWrapper")
    else:
        out["hybrid_cp"] = Seam("hybrid_cp")
    for seam, value in MAP_KEY.items():
        keys = _entries(scheduler_map, value)
        out[seam] = Seam(seam, keys) if keys else Seam(seam, absent=f"this Megatron's scheduler_map has no {value} "
                                                                    "(Megatron-LM main has dp_balanced, dev both)")
    return out


def _original(cls: type) -> type:
    """The scheduler a drop-in replaced (so installing twice replaces Megatron's class, not hydraplan's)."""
    return getattr(cls, "hydraplan_base", cls)


def install(profile: Any, *, seams: Sequence[str] | None = None, check_every: int | None = None) -> Callable[[], None]:
    """Put hydraplan's schedulers into Megatron (call before `pretrain(...)`): every seam this Megatron has and
    uses, or those named in `seams`; returns the function undoing it. `profile` is a bundled name, a profile file
    or a Profile. `check_every`: compare the DPxCP group's schedules every that many batches (default: the
    HYDRAPLAN_CHECK_SCHEDULE environment variable; 0 or unset: never)."""
    unknown = [s for s in seams or () if s not in SEAMS]
    if unknown:
        raise UserError(f"install: seams {unknown} unknown (choose from {', '.join(SEAMS)})")
    prof = load(profile)
    try:
        data_schedule: Any = importlib.import_module(DATA_SCHEDULE)  # Megatron's module: its names are not typed here
    except ImportError as e:
        raise UserError(f"{DATA_SCHEDULE} does not import ({e}): put the Megatron-LM checkout (or megatron-core) on "
                        "sys.path before install()") from None
    found = seams_of(data_schedule)
    wanted = list(seams) if seams is not None else [s for s in SEAMS if not found[s].absent and not found[s].unused]
    factories = {"packing": packing_drop_in, "dynamic_cp": dynamic_cp_drop_in}
    undo: list[Callable[[], None]] = []
    done = []
    for name in wanted:
        seam = found[name]
        if seam.absent:
            say(f"{NAMED[name]} not installed: {seam.absent}", warn=True)
            continue
        if seam.unused:
            say(f"{NAMED[name]} installed but never used: {seam.unused}", warn=True)
        if name == "hybrid_cp":
            saved = data_schedule.BalancedCPScheduler
            data_schedule.BalancedCPScheduler = drop_in(prof, _original(saved), every=check_every)
            undo.append(functools.partial(setattr, data_schedule, "BalancedCPScheduler", saved))
        else:
            scheduler_map = data_schedule.scheduler_map
            for key in seam.keys:
                saved = scheduler_map[key]
                scheduler_map[key] = factories[name](prof, _original(saved), every=check_every)
                undo.append(functools.partial(scheduler_map.__setitem__, key, saved))
        done.append(NAMED[name])
    skipped = [f"{NAMED[s]}: {found[s].unused}" for s in SEAMS if seams is None and found[s].unused]
    if done:
        say(f"profile {prof.name} now schedules Megatron's {' and '.join(done)}"
            + (f" (left alone: {'; '.join(skipped)})" if skipped else ""))
    elif seams is None:
        say("nothing installed: " + "; ".join(f"{NAMED[s]}: {found[s].absent or found[s].unused}" for s in SEAMS),
            warn=True)

    def uninstall() -> None:
        for step in reversed(undo):
            step()

    return uninstall
