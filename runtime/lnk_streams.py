"""LNK pull and push of one iteration, one layer group at a time, with a bounded number of groups in flight.

Each direction runs on a helper thread of its own (on CUDA, on a stream of its own: runtime/device.py) that
posts the groups' all_to_all_single exchanges (runtime/lnk.py compiles them) on the direction's process
group in an order every rank shares, with at most `depth` groups posted and not yet completed: before
posting another, it completes the oldest, unpacks it (pull) or sums it into the owner shard (push) and
frees its send and receive buffers. So what LNK holds besides the stage's parameters, its gradients and
the owner shard's summed gradient is at most `depth` groups' buffers per direction, whatever the strategy
(the terms `lnk_pull` and `lnk_push` of hydraplan.core.memory). A helper thread waits only for its own
direction's exchanges and, for push, for this rank's gradients of the group to be final, never for
another rank's compute, so the threads of all ranks make progress together and cannot deadlock; the
compute thread waits only for what it uses: a pulled group right before its first use, and the summed
push at the end.

pull: owners cast their master shard to the compute dtype (the paper's "To" before LNK) and send the pieces;
  a received group becomes one buffer whose views are the stage module's parameters (`on_arrival`), one
  buffer per group (views share their base's autograd version counter, so filling group k+1 into a buffer
  that layer k's saved weights view would invalidate them).
push: every rank sends its stage's gradients in the compute dtype (bf16 for bf16 runs: each pipeline's fp32
  accumulation rounded once, 2 bytes per value as the end-to-end estimate counts; the tolerance of
  run_plan --verify covers it) and the owner sums every replica's contribution in the master dtype (fp32).

Timings go to a LinkClock in device stamps (runtime/device.py), resolved to seconds after the step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hydraplan.core.memory import LNK_PULL_DEPTH, LNK_PUSH_DEPTH
from hydraplan.runtime.device import Device
from hydraplan.runtime.lnk import GroupExchange, LinkPlan


@dataclass
class LinkClock:
    """What LNK cost one rank in an iteration, as device stamps until `resolve` turns them into wall seconds
    (time.time() scale, comparable across the ranks of a host): every exchange's post and completion, and the
    compute thread's waits for it.

    An exchange cannot complete before the last rank has posted it, so a wait splits in two: the part before
    that instant is waiting for a slower peer (pipeline imbalance, which the planner models as propagation
    time), the part after is communication the compute did not hide: `exposed` (needs every rank's post
    instants, `split_waits`). pack_s: host seconds the LNK threads spent packing, unpacking and summing."""

    dev: Device = field(default_factory=Device)
    pack_s: float = 0.0
    posts: dict[tuple[str, int], Any] = field(default_factory=dict)
    done: dict[tuple[str, int], Any] = field(default_factory=dict)
    waits: list[tuple[str, int, Any, Any]] = field(default_factory=list)

    def track(self, work: dist.Work, kind: str, g: int) -> None:
        key = (kind, g)
        self.posts[key] = self.dev.stamp()
        self.dev.on_complete(work, lambda stamp: self.done.setdefault(key, stamp), kind)

    def completed(self, kind: str, g: int) -> None:
        """The posting thread saw the exchange complete (bounds its completion if no callback has yet)."""
        self.done.setdefault((kind, g), self.dev.stamp())

    def resolve(self) -> None:
        """Stamps to seconds; call once, after the device is synchronized."""
        sec = self.dev.seconds
        self.posts = {k: sec(v) for k, v in self.posts.items()}
        self.done = {k: sec(v) for k, v in self.done.items()}
        self.waits = [(kind, g, sec(t), sec(end)) for kind, g, t, end in self.waits]

    def busy_s(self, kind: str) -> float:
        """Wall time with at least one exchange of this direction in flight (posted, not yet completed)."""
        total, end = 0.0, -float("inf")
        for lo, hi in sorted((t, self.done[k]) for k, t in self.posts.items() if k[0] == kind):
            if hi > end:
                total += hi - max(lo, end)
                end = hi
        return total

    def split_waits(self, last_post: dict[tuple[str, int], float]) -> tuple[float, float]:
        """(exposed, peer wait) seconds, given the instant the last rank posted each exchange."""
        exposed = peer = 0.0
        for kind, g, t, end in self.waits:
            ready = min(max(t, last_post[(kind, g)]), end)
            peer += ready - t
            exposed += end - ready
        return exposed, peer


@dataclass
class _InFlight:
    g: int
    work: dist.Work
    send: torch.Tensor  # kept alive until the exchange completes
    recv: torch.Tensor
    thread: int = field(default_factory=threading.get_ident)  # the poster's, whose stream allocated the buffers


class _Direction:
    """What pull and push share: the helper thread, the bounded window of exchanges in flight, and the
    per-group hand-over to the compute thread (a threading.Event, plus a stream marker on CUDA)."""

    kind = ""

    def __init__(self, plan: LinkPlan, groups: tuple[GroupExchange, ...], group: dist.ProcessGroup | None,
                 overlap: bool, clock: LinkClock, depth: int):
        self.plan, self.exchanges, self.group, self.overlap, self.clock = plan, groups, group, overlap, clock
        self.dev = clock.dev
        self.depth = max(1, depth)
        self.groups = len(groups)
        self._handed = [threading.Event() for _ in range(self.groups)]
        self._marker: list[Any] = [None] * self.groups
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _spawn(self, body: Callable[[], None], uses: tuple[torch.Tensor, ...] = ()) -> None:
        """Run body on the helper thread, after what the compute stream queued so far (on CUDA). `uses`: tensors
        of the compute stream the helper's stream reads or writes too."""
        after = self.dev.event()

        def run() -> None:
            try:
                with self.dev.side_stream(self.kind):
                    self.dev.wait_for(after)
                    for t in uses:
                        self.dev.record_stream(t)
                    body()
            except BaseException as e:  # handed to the compute thread, which raises it where it waits
                self._error = e
            finally:
                for ev in self._handed:
                    ev.set()

        self._thread = threading.Thread(target=run, name=f"lnk-{self.kind}", daemon=True)
        self._thread.start()

    def _post(self, g: int, send: torch.Tensor, recv: torch.Tensor) -> _InFlight:
        ge = self.exchanges[g]
        work = dist.all_to_all_single(recv[:ge.recv_total], send, ge.recv_splits, ge.send_splits, group=self.group,
                                      async_op=True)
        self.clock.track(work, self.kind, g)
        return _InFlight(g, work, send, recv)

    def _run_window(self, order: list[int], before_post: Callable[[int], None] | None = None,
                    record: bool = False) -> None:
        """Post the groups in `order` with at most `depth` in flight, completing the oldest first."""
        inflight: deque[_InFlight] = deque()
        for g in order:
            if before_post is not None:
                before_post(g)
            while len(inflight) >= self.depth:
                self._finish_one(inflight.popleft(), record)
            inflight.append(self._start_one(g))
        while inflight:
            self._finish_one(inflight.popleft(), record)

    def _finish_one(self, fl: _InFlight, record: bool) -> None:
        t = self.dev.stamp()
        self.dev.host_wait(fl.work)
        if record:  # the waiting thread is the compute thread (no overlap): its wait is exposed
            self.clock.waits.append((self.kind, fl.g, t, self.dev.stamp()))
        self.clock.completed(self.kind, fl.g)
        if fl.thread != threading.get_ident():
            # posted from another thread (push: by the backward), so allocated on the compute stream; this stream
            # reads recv and drops both, so the allocator must not hand them to the compute stream before it is done
            for t in (fl.send, fl.recv):
                if t.numel():
                    self.dev.record_stream(t)
        start = time.perf_counter()
        self._complete(fl)
        self._marker[fl.g] = self.dev.event()
        self.clock.pack_s += time.perf_counter() - start
        self._handed[fl.g].set()

    def _take(self, g: int) -> None:
        """Compute thread: wait until group g is handed over (recorded as a wait), raise the helper's error."""
        t = self.dev.stamp()
        self._handed[g].wait()
        if self._error is not None:
            raise self._error
        self.dev.wait_for(self._marker[g])
        self.clock.waits.append((self.kind, g, t, self.dev.stamp()))

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def _start_one(self, g: int) -> _InFlight:
        raise NotImplementedError

    def _complete(self, fl: _InFlight) -> None:
        raise NotImplementedError


class PullStream(_Direction):
    """Pull every layer group into `out[g]` (this rank's stage parameters of group g, flat in canonical order,
    in the compute dtype); `wait(g)` hands group g to `on_arrival(g, buf)`, which makes the module's parameters
    views of it. With overlap the helper thread pulls ahead while the stage computes (layer k+1 arrives while
    layer k runs) and the compute thread waits for a group right before its first use; without, `start`
    pulls everything before the propagation."""

    kind = "pull"

    def __init__(self, plan: LinkPlan, shard: torch.Tensor, dtype: torch.dtype, group: dist.ProcessGroup | None,
                 overlap: bool, clock: LinkClock, depth: int = LNK_PULL_DEPTH):
        super().__init__(plan, plan.pull_groups, group, overlap, clock, depth)
        self.shard, self.dtype = shard, dtype
        self.out: list[torch.Tensor | None] = [None] * self.groups
        self.on_arrival: Callable[[int, torch.Tensor], None] | None = None
        self._given = [False] * self.groups

    def _start_one(self, g: int) -> _InFlight:
        ge = self.exchanges[g]
        start = time.perf_counter()
        src = self.shard[ge.src[0]:ge.src[1]].to(self.dtype)  # the paper's "To" before LNK: owners cast
        send = ge.pack(src, src.new_empty(ge.pack.total))
        recv = send.new_empty(ge.recv_total)
        self.clock.pack_s += time.perf_counter() - start
        return self._post(g, send, recv)

    def _complete(self, fl: _InFlight) -> None:
        ge = self.exchanges[fl.g]
        buf = self.shard.new_empty(ge.dst[1] - ge.dst[0], dtype=self.dtype)
        if ge.rounds:
            ge.rounds[0](fl.recv, buf)
        self.out[fl.g] = buf
        fl.send = fl.recv = None  # this group's exchange buffers are free now

    def start(self) -> None:
        order = list(range(self.groups))
        if self.overlap:
            self._spawn(lambda: self._run_window(order))
            return
        self._run_window(order, record=True)
        for g in order:
            self._hand(g)

    def wait(self, g: int) -> None:
        """Block until group g is in `out` and bound (no-op if it already is)."""
        if self._given[g]:
            return
        if self.overlap:
            self._take(g)
        self._hand(g)

    def _hand(self, g: int) -> None:
        self._given[g] = True
        buf = self.out[g]
        if self.overlap and buf.numel():
            self.dev.record_stream(buf)  # allocated on the helper's stream, used on the compute stream
        if self.on_arrival is not None:
            self.on_arrival(g, buf)

    def finish(self) -> None:
        """Every exchange completed (this rank's sends included) and every group handed over."""
        for g in range(self.groups):
            self.wait(g)
        self._join()


class PushStream(_Direction):
    """Push gradients one layer group at a time from `grads` (flat like PullStream.out, in the accumulation
    dtype) to the owners, who sum every replica's contribution into `out` (the rank's optimizer shard, in
    `master_dtype`). Groups go in reverse canonical order (the order backward finishes them); a group is
    posted once it is `ready` (its gradients are final; groups this rank holds nothing of are ready from the
    start) and fewer than `depth` groups are in flight. With overlap a group is posted by whichever thread
    makes that true first: the backward that finishes it (so a push starts at once, no thread hand-over) or
    the helper thread that completed and summed the oldest group in flight; without, everything is pushed in
    `finish`."""

    kind = "push"

    def __init__(self, plan: LinkPlan, grads: torch.Tensor, dtype: torch.dtype, group: dist.ProcessGroup | None,
                 overlap: bool, clock: LinkClock, master_dtype: torch.dtype | None = None, depth: int = LNK_PUSH_DEPTH):
        super().__init__(plan, plan.push_groups, group, overlap, clock, depth)
        self.grads, self.dtype = grads, dtype
        self._order = list(range(self.groups - 1, -1, -1))
        self._ready = [not plan.needed(g) for g in range(self.groups)]
        self._ready_marker: list[Any] = [None] * self.groups
        self.out = grads.new_zeros(plan.owned.total, dtype=master_dtype or grads.dtype)
        self._cond = threading.Condition()
        self._next = 0  # position in _order of the next group to post
        self._inflight: deque[_InFlight] = deque()
        if overlap:
            self._post_ready()
            self._spawn(self._complete_all, uses=(grads, self.out))

    def ready(self, g: int) -> None:
        """Group g's gradients are final (called from the backward; on CUDA, after their accumulation was queued)."""
        self._ready_marker[g] = self.dev.event()
        self._ready[g] = True
        if self.overlap:
            self._post_ready()

    def _post_ready(self) -> None:
        """Post, in order, every next group that is ready while fewer than `depth` are in flight."""
        with self._cond:
            while (self._next < self.groups and self._ready[self._order[self._next]]
                   and len(self._inflight) < self.depth):
                g = self._order[self._next]
                self.dev.wait_for(self._ready_marker[g])
                self._inflight.append(self._start_one(g))
                self._next += 1
                self._cond.notify_all()

    def _complete_all(self) -> None:
        """Helper thread: complete and sum the oldest group in flight, then post what that made room for."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._inflight or self._next == self.groups)
                if not self._inflight:
                    return
                fl = self._inflight[0]
            self._finish_one(fl, record=False)
            with self._cond:
                self._inflight.popleft()
            self._post_ready()

    def _start_one(self, g: int) -> _InFlight:
        ge = self.exchanges[g]
        start = time.perf_counter()
        src = self.grads[ge.src[0]:ge.src[1]].to(self.dtype)
        send = ge.pack(src, src.new_empty(ge.pack.total))
        recv = src.new_empty(ge.recv_total + ge.zero_tail)
        recv[ge.recv_total:].zero_()
        self.clock.pack_s += time.perf_counter() - start
        return self._post(g, send, recv)

    def _complete(self, fl: _InFlight) -> None:
        """Sum the group's contributions into the owner shard: one batched reduction when they lie stacked in the
        receive buffer (GroupExchange.stacked), else one gather and add per round of contributions."""
        ge = self.exchanges[fl.g]
        dst = self.out[ge.dst[0]:ge.dst[1]]
        if ge.stacked is not None:  # every contribution a whole copy of the range: one batched reduction
            (start, count), n = ge.stacked, dst.numel()
            torch.sum(fl.recv[start:start + count * n].view(count, n), dim=0, dtype=dst.dtype, out=dst)
        elif ge.rounds and fl.recv.dtype == dst.dtype:
            ge.rounds[0](fl.recv, dst)  # out starts at zero: the first round is assigned
            scratch = torch.empty_like(dst) if len(ge.rounds) > 1 else None
            for r in ge.rounds[1:]:
                dst.add_(r(fl.recv, scratch))
        elif ge.rounds:
            scratch = torch.empty_like(dst, dtype=fl.recv.dtype)
            for r in ge.rounds:
                dst.add_(r(fl.recv, scratch))  # the wire dtype promoted: summed in the master dtype
        fl.send = fl.recv = None

    def finish(self) -> torch.Tensor:
        """Every group's exchange completed and summed; returns the owner shard's summed gradient."""
        self._ready = [True] * self.groups
        if not self.overlap:
            self._run_window(self._order, record=True)
            return self.out
        self._post_ready()
        for g in self._order:
            self._take(g)
        self._join()
        return self.out


def pull(plan: LinkPlan, shard: torch.Tensor, dtype: torch.dtype, group: dist.ProcessGroup | None = None,
         dev: Device | None = None) -> torch.Tensor:
    """This rank's stage parameters, flat in canonical order, gathered from the owners' master shards (synchronous)."""
    stream = PullStream(plan, shard, dtype, group, overlap=False, clock=LinkClock(dev or Device()))
    stream.start()
    stream.finish()
    return torch.cat(stream.out)


def push(plan: LinkPlan, grads: torch.Tensor, dtype: torch.dtype, group: dist.ProcessGroup | None = None,
         dev: Device | None = None, master_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gradient of this rank's optimizer shard: the sum over all pipelines of their contributions (synchronous).
    `grads` is the rank's stage gradients flat like pull's output (empty when the rank is idle), sent in `dtype`."""
    return PushStream(plan, grads, dtype, group, overlap=False, clock=LinkClock(dev or Device()),
                      master_dtype=master_dtype).finish()
