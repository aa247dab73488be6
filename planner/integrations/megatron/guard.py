"""What keeps a training job running around hydraplan's schedules: the settings checked at the first call, a batch
hydraplan cannot schedule handed to Megatron's own scheduler, and (HYDRAPLAN_CHECK_SCHEDULE=N) the schedules of the
DPxCP group compared every N batches. Each thing it has to say is one line on rank 0, prefixed `hydraplan:`.

Every rank of a DPxCP group computes its schedule itself from the same gathered lengths, so every decision here
(a fallback, a check failing) is the same on every rank without a message between them; only the optional
comparison talks to the others, through the group Megatron's own rerouting uses next.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

CHECK_ENV = "HYDRAPLAN_CHECK_SCHEDULE"
Schedule = list[list[list[int]]]


def is_rank0() -> bool:
    """Rank 0 of the job: torch.distributed's rank once it is up, torchrun's RANK before (0 without either)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def say(message: str, *, warn: bool = False) -> None:
    """One line on rank 0: stdout for what hydraplan does, stderr for a warning."""
    if is_rank0():
        print(f"hydraplan: {message}", file=sys.stderr if warn else sys.stdout, flush=True)


def check_every(value: int | None = None) -> int:
    """How often the DPxCP group compares its schedules: `value`, else HYDRAPLAN_CHECK_SCHEDULE, 0 (never) unset."""
    if value is None:
        raw = os.environ.get(CHECK_ENV, "").strip()
        try:
            value = int(raw) if raw else 0
        except ValueError:
            say(f"{CHECK_ENV}={raw!r} is not a whole number of batches: schedules are not compared", warn=True)
            return 0
    return max(int(value), 0)


def digest(schedule: Schedule) -> str:
    """A schedule's fingerprint: equal on two ranks only when their schedules are."""
    return hashlib.sha256(json.dumps(schedule, separators=(",", ":")).encode()).hexdigest()[:16]


def gather(value: str, group: Any) -> list[str]:
    """`value` of every rank of `group` (torch.distributed, whatever its backend)."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return [str(v) for v in out]


class Guard:
    """One drop-in's watch over its schedules in a job. `seam` names it in messages, `theirs` is Megatron's
    scheduler it replaces (e.g. "default_dynamic_cp")."""

    def __init__(self, seam: str, theirs: str, every: int | None = None) -> None:
        self.seam, self.theirs = seam, theirs
        self.every = check_every(every)
        self.target: Any = None
        self.disabled = ""  # why Megatron's scheduler runs every batch
        self.batches = 0
        self.fallbacks = 0

    def schedule(self, build: Callable[[], Any], plan: Callable[[Any], Schedule], megatron: Callable[[], Any],
                 *, about: Callable[[Any], tuple[str, list[str]]], group: Any = None,
                 to_groups: Callable[[Schedule], Any] = lambda s: s) -> Any:
        """The batch's schedule: `plan(target)` passed through `to_groups` (Megatron's return value), or
        `megatron()` where hydraplan cannot schedule it. `build()` makes the target at the first call, where
        every setting is checked: `about(target)` says what hydraplan schedules for, and what to warn of."""
        self.batches += 1
        if self.target is None and not self.disabled:
            try:
                self.target = build()
            except Exception as e:  # a setting this profile or executor cannot price: the job goes on as Megatron's
                self.disabled = _one_line(e)
                say(f"{self.seam}: {self.disabled}; Megatron's {self.theirs} schedules every batch", warn=True)
            else:
                what, warnings = about(self.target)
                say(f"{self.seam}: {what}")
                for line in warnings:
                    say(f"{self.seam}: {line}", warn=True)
        if self.disabled:
            return megatron()
        try:
            ours = plan(self.target)
        except Exception as e:
            self.fallbacks += 1
            if self.fallbacks & (self.fallbacks - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a log that stays short
                say(f"{self.seam}: batch {self.batches}: {_one_line(e)}; Megatron's {self.theirs} schedules it "
                    f"({self.fallbacks} of {self.batches} batches so far)", warn=True)
            return megatron()
        if group is not None and self.every and (self.batches - 1) % self.every == 0:
            seen = gather(digest(ours), group)
            if len(set(seen)) > 1:
                odd = [r for r, d in enumerate(seen) if d != seen[0]]
                self.disabled = f"schedules differ across the DPxCP group at batch {self.batches} (ranks {odd} " \
                                f"differ from rank 0)"
                say(f"{self.seam}: {self.disabled}; Megatron's {self.theirs} schedules every batch from now on",
                    warn=True)
                return megatron()
        return to_groups(ours)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if type(e).__name__ == "UserError" else f"{type(e).__name__}: {text}"
