"""Planning while training: `run_plan.py` without a plan argument plans its own iterations ahead.

It takes what `hydraplan pack` takes, under the same names (`--gpus` is the world size), and plans exactly
pack's plans (job/planrun.py: the same run, each plan a function of the run and its batch alone). The
planning is spread over the job's nodes: iteration i is planned by node i mod nodes, in planner processes
of that node's first rank (engine/pool.py), up to `--plan-ahead` iterations ahead of training. A thread on
every rank takes the plans in iteration order from the node that made each one, over a gloo group of the
job's own torch.distributed (a broadcast of the plan's compact bytes, store/planfile.py; no pickled
object on the wire), and queues them for training; rank 0 logs how long training waited for each.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from hydraplan.core.errors import UserError, cli_message
from hydraplan.core.options import Opt, Option, add_flags, nest, options
from hydraplan.core.schema import PackArgs, Plan
from hydraplan.engine.pool import solve_in_order
from hydraplan.job.config import RunConfig, build
from hydraplan.job.planrun import PlanRun
from hydraplan.runtime.groups import RankSet
from hydraplan.solve.placement import cad_groups, family, process_groups
from hydraplan.store.fileio import load_model, model_json, write_model
from hydraplan.store.planfile import decode, encode, write_plan
from hydraplan.store.profiles import load_profile
from hydraplan.store.runfolder import STRATEGIES_FILE, plan_path

RUN_FILE = "planned_run.json"  # in a --save folder: the planning arguments --resume must repeat


class OnlineConfig(BaseModel):
    """run_plan's planning while training, typed once from its flags: the run (pack's options, `run`) and how the
    job plans it. Every field with an `Opt` is a flag (add_arguments), so each is declared here or in the run's
    config only."""

    model_config = ConfigDict(extra="forbid")

    run: RunConfig
    planners_per_node: Annotated[PositiveInt, Opt("planner processes on each node's first rank")] = 2
    plan_ahead: Annotated[PositiveInt | None, Opt(
        "plan up to this many iterations ahead of the one training (default: 2 per planner process)")] = None
    stop_at: Annotated[int | None, Opt("train only the iterations before this one now (save with --save, continue "
                                       "with --resume)")] = None
    save_plans: Annotated[Path | None, Opt("write the plans trained on (and strategies.json) to this folder")] = None
    format: Annotated[Literal["json", "compact"], Opt("--save-plans file form")] = "json"

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, values: Any) -> Any:
        return nest(cls, values) if isinstance(values, dict) else values


def planning_options() -> list[Option]:
    """The flags of planning while training: pack's options but those marked `Opt(online=False)` (--dataset and
    --iterations are run_plan's own, --gpus is the world size), then the online ones."""
    return [o for o in options(OnlineConfig) if o.opt.online]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The planning flags, generated from their one declaration (pack's names, help and meaning). Not given:
    None, so that the config's default applies, and so that replaying a plan can refuse any that was given."""
    add_flags(ap.add_argument_group("planning while training (no plan argument): the options of `hydraplan pack`"),
              planning_options())


def check_replay_args(args: argparse.Namespace) -> None:
    """UserError for a planning option given with a plan argument (it would be ignored)."""
    given = [o for o in planning_options() if getattr(args, o.name) is not None]
    if given:
        raise UserError(f"{given[0].flag}: planning options apply only without a plan argument "
                        f"(the job then plans its own iterations); {args.plan} is replayed as planned")


def online_config(args: argparse.Namespace, world: int) -> OnlineConfig:
    """The planning flags typed and checked once, as pack checks them; `world` ranks are the run's GPUs."""
    if args.dataset is None or args.profile is None or args.tokens_per_iter is None or args.iterations is None:
        raise UserError("without a plan argument run_plan plans while it trains: give --profile, --dataset, "
                        "--tokens-per-iter and --iterations (as to hydraplan pack)")
    given = {o.name: getattr(args, o.name) for o in planning_options()}
    try:
        return build(OnlineConfig, **given, dataset=args.dataset, gpus=world, iterations=args.iterations)
    except UserError as e:  # said as the flag the user gave
        raise UserError(cli_message(e)) from None


def profile_sha256(config: RunConfig) -> str:
    return hashlib.sha256(model_json(load_profile(config.profile)).encode()).hexdigest()


def save_run(folder: str | Path, config: RunConfig) -> None:
    """Record the planning arguments beside a checkpoint (every rank: nodes may share no filesystem), for --resume."""
    write_model(Path(folder) / RUN_FILE, config.args(profile_sha256(config)).model_copy(
        update={"iterations": config.iterations}))


def check_resume(folder: str | Path, config: RunConfig) -> None:
    """UserError unless the checkpoint was saved by a run planned with the same arguments."""
    path = Path(folder) / RUN_FILE
    if not path.exists():
        raise UserError(f"--resume: {path}: no such file (the checkpoint was not saved by a run that plans while it "
                        "trains)")
    old = load_model(PackArgs, path).model_dump()
    new = {**config.args(profile_sha256(config)).model_dump(), "iterations": config.iterations}
    for k, v in new.items():
        if old.get(k) != v:
            raise UserError(f"--resume: {path}: field {k}: the run was planned with {old.get(k)!r}, now {v!r}; "
                            "resuming needs the same planning arguments")


@dataclass(frozen=True)
class Topology:
    """The job's nodes (torchrun's GROUP_RANK of every rank): which node plans an iteration, and its first rank."""

    node: int
    leaders: tuple[int, ...]  # the first rank of each node

    @classmethod
    def of(cls, group: dist.ProcessGroup) -> Topology:
        """Over `group`, a gloo group of every rank (CPU tensors, whatever the training's backend)."""
        mine = torch.tensor([int(os.environ.get("GROUP_RANK", 0))], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine, group=group)
        nodes = [int(t) for t in every]
        order = sorted(set(nodes))
        return cls(order.index(int(mine)), tuple(nodes.index(n) for n in order))

    @property
    def nodes(self) -> int:
        return len(self.leaders)

    def planner_of(self, iteration: int) -> int:
        return iteration % self.nodes

    @property
    def leader(self) -> bool:
        return dist.get_rank() == self.leaders[self.node]


def startup_groups(run: PlanRun) -> list[RankSet]:
    """Every TP, CP and CAD group the run's plans can use: the family of its schemes, the groups of
    candidates on hand-written ranks, and CAD's exchange groups."""
    planner, gpus = run.planner, run.cluster.gpus
    out = dict.fromkeys(family(planner.scheme_keys, gpus))
    out.update(dict.fromkeys(sorted(process_groups(p for c in planner.strategies.candidates for p in c.pipelines))))
    if run.config.plan.cad:
        out.update(dict.fromkeys(cad_groups([s.key for s in run.cluster.schemes if s.cp == 1], gpus)))
    return list(out)


def broadcast_groups(groups: list[RankSet] | None, group: dist.ProcessGroup) -> list[RankSet]:
    """Rank 0's group list to every rank, as one int tensor (each group's size, then its ranks)."""
    flat = torch.tensor([x for g in groups for x in (len(g), *g)] if groups else [], dtype=torch.int64)
    n = torch.tensor([flat.numel()], dtype=torch.int64)
    dist.broadcast(n, 0, group=group)
    if dist.get_rank() != 0:
        flat = torch.empty(int(n), dtype=torch.int64)
    dist.broadcast(flat, 0, group=group)
    values, out, k = flat.tolist(), [], 0
    while k < len(values):
        out.append(tuple(values[k + 1:k + 1 + values[k]]))
        k += 1 + values[k]
    return out


class PlanFeed:
    """The plans of iterations [start, stop) in order, planned ahead on their nodes and broadcast to every
    rank by a thread of its own; `waits` holds how long training waited for each (rank 0 logs them).

    On a node's first rank a second thread keeps its planner processes busy from the start: it takes their
    plans (this node's share, in order) as they come, up to `ahead / nodes` of them encoded and waiting.
    `prepare_with(f)`: the feed thread calls f on each plan before training can take it (the runtime makes
    the plan's LNK plan there, ahead of the step that needs it)."""

    def __init__(self, run: PlanRun | None, topology: Topology, start: int, stop: int, planners: int, ahead: int,
                 group: dist.ProcessGroup, check: Callable[[Plan], None]):
        self.topology, self.start, self.stop, self.group, self.check = topology, start, stop, group, check
        self.ready: queue.Queue[Plan | UserError] = queue.Queue(maxsize=ahead)
        self.waits: list[float] = []
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._prepare: Callable[[Plan], None] | None = None
        self._unprepared: dict[int, Plan] = {}  # by iteration: plans queued before prepare_with, not yet taken
        self._threads = [threading.Thread(target=self._feed, name="hydraplan-plan-feed", daemon=True)]
        if topology.leader:
            assert run is not None
            self._mine: queue.Queue[tuple[bytes, Plan | None]] = queue.Queue(maxsize=max(1, math.ceil(ahead / topology.nodes)))
            self._threads.append(threading.Thread(target=self._plan, args=(run, planners), name="hydraplan-planner",
                                                  daemon=True))
        for t in self._threads:
            t.start()

    def _plan(self, run: PlanRun, planners: int) -> None:
        """This node's share of the iterations, planned in `planners` processes, queued as compact bytes (a
        planning failure as `!` and its message, which every rank then raises)."""
        share = (b for b in run.batches(self.start) if self.topology.planner_of(b.iteration) == self.topology.node)
        try:
            with contextlib.closing(solve_in_order(run.planner, map(run.planner.check_feasible, share), planners,
                                                   planners)) as results:
                for result in results:
                    if not self._offer(self._mine, (encode(result.plan), result.plan)):
                        return
        except Exception as e:  # noqa: BLE001 -- any failure must reach every rank, or they would wait forever
            message = str(e) if isinstance(e, UserError) else f"planning failed: {e!r}"
            self._offer(self._mine, (b"!" + message.encode(), None))

    def _offer(self, q: queue.Queue, item: object) -> bool:
        """Put, unless training stops first (then the item is dropped: False)."""
        while not self._abort.is_set():
            with contextlib.suppress(queue.Full):
                q.put(item, timeout=0.05)
                return True
        return False

    def _next_mine(self) -> tuple[bytes, Plan | None]:
        """This node's next plan, or nothing once training stops."""
        while not self._abort.is_set():
            with contextlib.suppress(queue.Empty):
                return self._mine.get(timeout=0.05)
        return b"", None

    def _feed(self) -> None:
        """Iteration by iteration, the planning node's first rank sends the plan's size, then its bytes; a size
        of -1 stops every rank's feed (the sender's training stopped: `close(abort=True)`; every rank stops at
        that same broadcast, so none is left waiting in another)."""
        for i in range(self.start, self.stop):
            src = self.topology.leaders[self.topology.planner_of(i)]
            data, plan = self._next_mine() if dist.get_rank() == src else (b"", None)
            size = torch.tensor([len(data) if data else -1], dtype=torch.int64)
            dist.broadcast(size, src, group=self.group)
            if int(size) < 0:
                return
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(int(size), dtype=torch.uint8)
            dist.broadcast(buf, src, group=self.group)
            raw = buf.numpy().tobytes()
            if raw.startswith(b"!"):  # a planning failure, which every rank raises at this iteration
                self._offer(self.ready, UserError(raw[1:].decode()))
                return
            if plan is None:
                plan = decode(raw, f"plan of iteration {i} from node {self.topology.planner_of(i)}")
            self._offer(self.ready, self._prepared(plan))

    def prepare_with(self, prepare: Callable[[Plan], None]) -> None:
        """Call `prepare` on every plan before training takes it: from now on on the feed thread, as each
        arrives; the plans already queued here, before training starts. `prepare` must not raise (a bad plan
        is refused by `check` when training takes it) and must make no collective."""
        with self._lock:
            self._prepare, queued, self._unprepared = prepare, list(self._unprepared.values()), {}
        for plan in queued:
            prepare(plan)

    def _prepared(self, plan: Plan) -> Plan:
        with self._lock:
            prepare = self._prepare
            if prepare is None:
                self._unprepared[plan.iteration] = plan
        if prepare is not None:
            prepare(plan)
        return plan

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[Plan]:
        for i in range(self.start, self.stop):
            t0 = time.perf_counter()
            got = self.ready.get()
            self.waits.append(time.perf_counter() - t0)
            with self._lock:
                self._unprepared.pop(i, None)
            if isinstance(got, UserError):
                raise got
            self.check(got)
            if dist.get_rank() == 0:
                print(f"plan: iteration {i} from node {self.topology.planner_of(i)}, training waited "
                      f"{self.waits[-1]:.3f}s", flush=True)
            yield got

    def close(self, abort: bool = False) -> None:
        """Wait for the threads (the feed's broadcasts are collective); the planner processes stop with them.
        `abort`: training stopped early on every rank (the same bad plan, or a planning error): planning stops,
        the next planning rank sends the stop, and plans still on their way are dropped."""
        if abort:
            self._abort.set()
        for t in self._threads:
            t.join()


def save_plans(folder: str | Path, fmt: str, run: PlanRun) -> Callable[[Plan], None]:
    """Rank 0: strategies.json now, and a writer of each plan trained on (store/runfolder.py names)."""
    folder = Path(folder)
    write_model(folder / STRATEGIES_FILE, run.planner.strategies)
    return lambda plan: write_plan(plan_path(folder, plan.iteration, fmt), plan)
