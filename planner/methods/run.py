"""A planned run: what `hydraplan pack` and a job that plans while it trains (runtime/online.py) share, so
that both plan the same iterations from the same arguments.

`RunConfig` is the arguments that decide a run's plans (PackArgs, which summary.json records) and how many
iterations it has; `PlanRun.prepare` loads the profile's cluster view and the dataset, resolves the
strategies (given, or proposed) with the static baseline's layout added, and builds the Planner;
`PlanRun.batches(start)` is the sampled stream from any iteration on, outlier queues replayed from the start.
A plan is `planner.solve(batch)`, a function of these alone, whoever computes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, ValidationError, field_validator

from hydraplan.core.cluster import MAX_GPUS, Cluster, Objective
from hydraplan.core.errors import UserError
from hydraplan.core.schema import PackArgs, Profile, Strategies
from hydraplan.engine.settings import PlanSettings
from hydraplan.solve.dispatch_methods import DispatchName
from hydraplan.solve.seqsplit import parse_seq1f1b

if TYPE_CHECKING:  # imported where used: a config (app/config.py) does not load the solvers
    from hydraplan.core.batch import Batch
    from hydraplan.engine.planner import Planner
    from hydraplan.methods.static import StaticBaseline
    from hydraplan.solve.delay import DelayRule
    from hydraplan.store.datasets import Dataset

C = TypeVar("C", bound=BaseModel)
POSITIVE = {"context_len": "a positive number of tokens"}
SAMPLE_CHUNK = 64  # iterations sampled at once: bounds memory on long runs


def build(cls: type[C], **values: Any) -> C:
    """The config, or a UserError for its first bad value in the CLI's words: `--gpus must be a positive integer
    (got 0)`, `--dispatch must be 'greedy' or 'ilp' (got 'x')`."""
    gpus = values.get("gpus")
    if isinstance(gpus, int) and gpus > MAX_GPUS:
        raise UserError(f"gpus must be at most {MAX_GPUS:,}, the largest size benchmarked (got {gpus:,})", "gpus")
    try:
        return cls(**values)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = "--" + field.replace("_", "-")
        got = err.get("input")
        if err["type"] in ("greater_than", "greater_than_equal"):
            raise UserError(f"{flag} must be {POSITIVE.get(field, 'a positive integer')} (got {got})") from None
        if err["type"] == "literal_error":
            raise UserError(f"{flag} must be {err['ctx']['expected']} (got {got!r})") from None
        if err["type"] == "value_error":
            raise UserError(str(err["ctx"]["error"])) from None
        raise UserError(f"{flag}: {err['msg']} (got {got!r})") from None


class RunConfig(PackArgs):
    """A run's plans: the PackArgs part (`args`) decides them, `iterations` says how many (the last one drains
    any outlier queue). `pack` adds its output options (app/config.py PackConfig)."""

    model_config = ConfigDict(extra="forbid")

    seed: NonNegativeInt = 0
    dispatch: DispatchName = "greedy"
    objective: Objective = "end-to-end"
    profile_sha256: str | None = None  # recorded once the profile is loaded (`args`)
    iterations: PositiveInt
    synthesize: bool = True  # None (neither --synthesize nor --candidates-only given): the default, on

    @field_validator("strategies", mode="before")
    @classmethod
    def _absolute(cls, v: str | Path | None) -> str | None:
        return None if v is None else str(Path(v).resolve())

    @field_validator("seq1f1b")
    @classmethod
    def _splits(cls, v: str | None) -> str | None:
        if v is not None:
            parse_seq1f1b(v)
        return v

    @field_validator("synthesize", mode="before")
    @classmethod
    def _synthesize_by_default(cls, v: bool | None) -> bool | None:
        return True if v is None else v

    @property
    def strategies_path(self) -> Path | None:
        return None if self.strategies is None else Path(self.strategies)

    def args(self, profile_sha256: str) -> PackArgs:
        """What summary.json records: the fields that decide the run's plans."""
        recorded = self.model_dump(include=set(PackArgs.model_fields))
        return PackArgs.model_validate({**recorded, "profile_sha256": profile_sha256})

    def settings(self) -> PlanSettings:
        return PlanSettings.model_validate(self.model_dump(include=set(PlanSettings.model_fields)))


@dataclass
class PlanRun:
    """A run ready to plan: its cluster view, dataset, Planner (candidates resolved, `static` added), static
    baseline and outlier-delay rule."""

    config: RunConfig
    cluster: Cluster
    dataset: Dataset
    planner: Planner
    baseline: StaticBaseline | None
    rule: DelayRule | None

    @classmethod
    def prepare(cls, config: RunConfig, profile: Profile, strategies_file: Path | None = None) -> PlanRun:
        """Everything before the first plan. The candidates: --strategies, else `strategies_file` (a resumed pack
        run's own strategies.json), else proposed."""
        from hydraplan.engine.planner import Planner
        from hydraplan.engine.strategies import warn_placement, with_static_candidate
        from hydraplan.methods.static import static_baseline
        from hydraplan.solve.delay import hydraplan_rule
        from hydraplan.store.datasets import check_batch, load_dataset

        cluster = Cluster.of(profile, config.gpus, config.objective)
        dataset = load_dataset(config.dataset, config.context_len)
        check_batch(dataset, config.tokens_per_iter)  # before the proposal, which takes the batch as nominal
        context_len = config.context_len or int(dataset.lengths.max())
        strategies = _strategies(config, cluster, dataset, config.strategies_path or strategies_file)
        warn_placement(strategies, cluster, context_len)
        baseline = static_baseline(cluster, dataset, context_len, config.tokens_per_iter, config.iterations, config.seed)
        if baseline is not None and config.static:
            strategies = with_static_candidate(strategies, baseline.scheme, cluster, config.context_len)
        planner = Planner.for_cluster(cluster, strategies, config.settings(), config.context_len, resolved=True)
        rule = hydraplan_rule(dataset.lengths, config.tokens_per_iter) if config.outlier_delay else None
        return cls(config, cluster, dataset, planner, baseline, rule)

    def batches(self, start: int = 0) -> Iterator[Batch]:
        """The batches of iterations [start, iterations). Under an outlier delay rule the queue is a function of
        the whole stream, so it is replayed from iteration 0 (sampling is cheap): a resumed run plans exactly
        what an uninterrupted one would."""
        from hydraplan.solve.delay import outlier_delay

        if self.rule is None:
            return self._sampled(start)
        return islice(outlier_delay(self._sampled(0), self.rule, self.config.iterations), start, None)

    def _sampled(self, start: int) -> Iterator[Batch]:
        from hydraplan.store.datasets import sample_iterations

        c = self.config
        for first in range(start, c.iterations, SAMPLE_CHUNK):
            n = min(SAMPLE_CHUNK, c.iterations - first)
            yield from sample_iterations(self.dataset, c.tokens_per_iter, n, c.seed, start=first)


def _strategies(config: RunConfig, cluster: Cluster, dataset: Dataset, source: Path | None) -> Strategies:
    """The strategies file resolved, else the proposal's candidates."""
    from hydraplan.engine.strategies import resolve_strategies
    from hydraplan.solve.proposal import propose
    from hydraplan.store.fileio import load_model

    if source is not None:
        return resolve_strategies(load_model(Strategies, source), cluster, context_len=config.context_len,
                                  source=str(source))
    context_len = config.context_len or int(dataset.lengths.max())
    longest = max(s.max_len for s in cluster.schemes)
    if config.context_len is None and context_len > longest:
        raise UserError(f"context_len needed: dataset {config.dataset}'s longest sequence ({context_len} tokens) exceeds "
                        f"the largest MaxLen of profile {cluster.name} at {cluster.gpus} GPUs ({longest})", "context_len")
    return propose(cluster, dataset, context_len, tokens_per_iter=config.tokens_per_iter)
