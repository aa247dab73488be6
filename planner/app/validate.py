"""Plan validation: every constraint of docs/formats.md, and every estimate recomputed with the canonical model.

Pure checks (`check_plan`, `check_ranks`) return Violations instead of raising, so one run reports
everything that is wrong at once; `validate_path` is the I/O edge used by `hydraplan validate`.
Unreadable input (missing file, bad JSON, schema mismatch) is a UserError, i.e. exit 2, not a violation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_estimate
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Plan, PlanPipeline, Profile, Scheme, Strategies, Summary
from hydraplan.core.sync import has_sync_model
from hydraplan.engine.strategies import short_candidates
from hydraplan.solve.placement import check_ranks, split_groups
from hydraplan.store.fileio import load_model
from hydraplan.store.planfile import read_plan
from hydraplan.store.runfolder import PLAN_FILE, STRATEGIES_FILE, SUMMARY_FILE, plan_files

REL_TOL = 1e-6


@dataclass(frozen=True)
class Violation:
    """One broken constraint, located as precisely as the check allows."""

    file: str
    kind: str
    message: str
    pipeline: int | None = None
    micro_batch: int | None = None
    severity: str = "error"  # "warning": legal but likely slow (placement), does not fail validation


@dataclass
class ValidationReport:
    plans: int = 0
    pipelines: int = 0
    micro_batches: int = 0
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "warning"]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _capacity(pipe: PlanPipeline, scheme: Scheme, bad: Callable[[str], None]) -> int:
    """Token capacity of a micro-batch: the scheme's MaxLen, raised by Seq1F1B when the pipeline (pp > 1)
    records K splits; a recorded seq1f1b_max_len must be the one K implies."""
    if pipe.seq1f1b_splits is None or scheme.pp == 1:
        return scheme.max_len
    from hydraplan.solve.seqsplit import seq1f1b_max_len

    raised = max(scheme.max_len, seq1f1b_max_len(scheme, pipe.seq1f1b_splits))
    if pipe.seq1f1b_max_len is not None and pipe.seq1f1b_max_len != seq1f1b_max_len(scheme, pipe.seq1f1b_splits):
        bad(f"seq1f1b_max_len {pipe.seq1f1b_max_len}, but K={pipe.seq1f1b_splits} splits give "
            f"{seq1f1b_max_len(scheme, pipe.seq1f1b_splits)}")
    return raised


class Views:
    """The profile as seen by each job size the validated plans name (one Cluster per size, built once)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._by_gpus: dict[int, Cluster | UserError] = {}

    def of(self, gpus: int) -> Cluster | UserError:
        if gpus not in self._by_gpus:
            try:
                self._by_gpus[gpus] = Cluster.of(self.profile, gpus)
            except UserError as e:
                self._by_gpus[gpus] = e
        return self._by_gpus[gpus]


def check_plan(plan: Plan, profile: Profile | Views, file: str = "<plan>", gpus_per_node: int | None = None) -> list[Violation]:
    """Every constraint of the plan contract, and the canonical estimates recomputed; TP/CP groups that
    span nodes are warnings (`split_groups`, node size default: the profile's)."""
    views = profile if isinstance(profile, Views) else Views(profile)
    out: list[Violation] = []
    if plan.profile != views.profile.name:
        out.append(Violation(file, "profile", f"plan is for profile {plan.profile!r}, checked against {views.profile.name!r}"))
    found = views.of(plan.gpus)
    cluster = None if isinstance(found, UserError) else found
    if isinstance(found, UserError):
        out.append(Violation(file, "scheme", str(found)))
    lengths = _check_batch(plan, file, out)
    _check_ranks(plan, file, gpus_per_node or views.profile.gpu.gpus_per_node, out)
    if plan.cad is not None:
        out.extend(_check_cad(plan, cluster, lengths, file) if cluster is not None else [])
        return out
    estimates = _check_pipelines(plan, cluster, lengths, file, out)
    if len(estimates) == len(plan.pipelines) and cluster is not None:
        expected = max(estimates, default=0.0)
        if not close(plan.estimate.propagation_s, expected):
            out.append(Violation(file, "estimate",
                                 f"propagation_s {plan.estimate.propagation_s!r}, the max over pipelines is {expected!r}"))
        out += check_sync(plan, cluster, estimates, file)
    return out


def _check_batch(plan: Plan, file: str, out: list[Violation]) -> dict[int, int]:
    """Sequence ids unique, none trained before it is sampled; returns length by id."""
    lengths: dict[int, int] = {}
    for s in plan.batch:
        if s.id in lengths:
            out.append(Violation(file, "batch", f"sequence id {s.id} listed twice in the batch"))
        lengths[s.id] = s.length
        if s.sampled_iteration is not None and s.sampled_iteration > plan.iteration:
            out.append(Violation(file, "batch", f"sequence id {s.id} is trained in iteration {plan.iteration} before it "
                                                f"is sampled (sampled_iteration {s.sampled_iteration})"))
    return lengths


def _check_ranks(plan: Plan, file: str, gpus_per_node: int, out: list[Violation]) -> None:
    used = sum(p.tp * p.pp * p.cp for p in plan.pipelines)
    if used > plan.gpus:
        out.append(Violation(file, "gpus", f"pipelines use {used} GPUs, the plan has {plan.gpus}"))
    for p, pipe in enumerate(plan.pipelines):
        if len(pipe.ranks) != pipe.tp * pipe.pp * pipe.cp:
            out.append(Violation(file, "ranks", f"{len(pipe.ranks)} ranks for tp*pp*cp = {pipe.tp * pipe.pp * pipe.cp} GPUs", p))
    for p, problem in check_ranks([pipe.ranks for pipe in plan.pipelines], plan.gpus):
        out.append(Violation(file, "ranks", problem, p))
    for p, pipe in enumerate(plan.pipelines):
        for problem in split_groups(pipe.ranks, pipe.tp, pipe.pp, pipe.cp, gpus_per_node):
            out.append(Violation(file, "placement", problem, p, severity="warning"))


def _check_pipelines(plan: Plan, cluster: Cluster | None, lengths: dict[int, int], file: str,
                     out: list[Violation]) -> list[float]:
    """Schemes, capacities and every sequence in exactly one micro-batch; returns the recomputed canonical
    estimate of each pipeline whose scheme is known."""
    position = {i: k for k, i in enumerate(lengths)}
    by_position = np.array(list(lengths.values()), dtype=np.int64)
    where: dict[int, list[tuple[int, int]]] = defaultdict(list)
    estimates: list[float] = []
    for p, pipe in enumerate(plan.pipelines):
        scheme = None if cluster is None else cluster.scheme(pipe.key)
        label = pipe.label
        if scheme is None and cluster is not None:
            out.append(Violation(file, "scheme", f"scheme {label} is not in profile {cluster.name} for {plan.gpus} GPUs", p))
        groups = []
        for m, mb in enumerate(pipe.micro_batches):
            for i in mb.seqs:
                where[i].append((p, m))
                if i not in lengths:
                    out.append(Violation(file, "coverage", f"sequence id {i} is not in the batch", p, m))
            groups.append(np.array([position[i] for i in mb.seqs if i in position], dtype=np.int64))
        if scheme is None:
            continue
        capacity = _capacity(pipe, scheme, lambda msg: out.append(Violation(file, "seq1f1b", msg, p)))
        for m, g in enumerate(groups):
            tokens = int(by_position[g].sum())
            if tokens > capacity:
                message = f"{tokens} tokens > max_len {capacity} of {label} at {plan.gpus} GPUs"
                out.append(Violation(file, "capacity", message, p, m))
        expected = pipeline_estimate(scheme, by_position, groups)
        estimates.append(expected)
        if not close(pipe.estimate_s, expected):
            out.append(Violation(file, "estimate", f"estimate_s {pipe.estimate_s!r}, the canonical estimate is {expected!r}", p))
    for i in lengths:
        places = where.get(i, [])
        if not places:
            out.append(Violation(file, "coverage", f"sequence id {i} (length {lengths[i]}) is in no micro-batch"))
        elif len(places) > 1:
            at = ", ".join(f"pipeline {p} micro-batch {m}" for p, m in places)
            out.append(Violation(file, "coverage", f"sequence id {i} is in {len(places)} micro-batches ({at})", *places[1]))
    return estimates


def check_sync(plan: Plan, cluster: Cluster, propagation: list[float], file: str) -> list[Violation]:
    """The docs/formats.md end-to-end fields recomputed from the pipelines' canonical estimates: required when the
    profile has a sync model, and checked whenever present (without a model the sync is 0)."""
    out: list[Violation] = []
    required = has_sync_model(cluster.profile)
    profile = cluster.profile
    est = cluster.estimate([p.key for p in plan.pipelines], propagation)
    if not plan.pipelines:
        est = est._replace(iteration_s=plan.estimate.propagation_s)

    def check(field: str, got: float | None, want: float, pipeline: int | None = None) -> None:
        if got is None:
            if required:
                out.append(Violation(file, "sync", f"field {field}: missing; profile {profile.name} has a sync model, "
                                                   f"the end-to-end estimate is {want!r}", pipeline))
        elif not close(got, want):
            out.append(Violation(file, "sync", f"field {field}: {got!r}, the end-to-end estimate is {want!r}", pipeline))

    for p, (pipe, exposed) in enumerate(zip(plan.pipelines, est.exposed_s, strict=True)):
        check(f"pipelines.{p}.sync_s", pipe.sync_s, exposed, p)
    check("estimate.sync_s", plan.estimate.sync_s, est.sync_s)
    check("estimate.iteration_s", plan.estimate.iteration_s, est.iteration_s)
    return out


def _check_cad(plan: Plan, cluster: Cluster, lengths: dict[int, int], file: str) -> list[Violation]:
    """A core-attention disaggregation plan (hydraplan.solve.cad): pieces cover every sequence once, tasks cover
    every query once, replicas hold at most MaxLen tokens per step, and the CAD estimate recomputes."""
    from hydraplan.solve.cad import estimate

    assert plan.cad is not None
    out: list[Violation] = []
    view = cluster.view
    if len(plan.pipelines) != plan.cad.replicas:
        out.append(Violation(file, "cad", f"{len(plan.pipelines)} pipelines, cad.replicas is {plan.cad.replicas}"))
    seen = {pc.seq for step in plan.cad.steps for pc in step.pieces}
    out.extend(Violation(file, "coverage", f"sequence id {i} (length {n}) is in no CAD step")
               for i, n in lengths.items() if i not in seen)
    expected, problems = estimate(view, plan.cad, lengths)
    out.extend(Violation(file, "cad", m) for m in problems)
    if not problems:
        for p, pipe in enumerate(plan.pipelines):
            if not close(pipe.estimate_s, expected):
                out.append(Violation(file, "estimate", f"estimate_s {pipe.estimate_s!r}, the CAD estimate is {expected!r}", p))
        if not close(plan.estimate.propagation_s, expected):
            out.append(Violation(file, "estimate",
                                 f"propagation_s {plan.estimate.propagation_s!r}, the CAD estimate is {expected!r}"))
    return out


def check_against_strategies(plan: Plan, strategies: Strategies, file: str) -> list[Violation]:
    """A plan in a run folder must use one of the run's candidates, pipeline for pipeline (unless its strategy
    was made for its batch: `synthesized`, or it is a CAD plan, planned per iteration)."""
    if plan.synthesized or plan.cad is not None:
        return []
    cand = next((c for c in strategies.candidates if c.name == plan.strategy), None)
    if cand is None:
        return [Violation(file, "strategy", f"strategy {plan.strategy!r} is not in strategies.json")]
    want = [(p.key, p.ranks) for p in cand.pipelines]
    got = [(p.key, p.ranks) for p in plan.pipelines]
    if want != got:
        return [Violation(file, "strategy", f"pipelines differ from candidate {cand.name} in strategies.json")]
    return []


def check_summary(summary: Summary, plans: dict[int, Plan], file: str) -> list[Violation]:
    """summary.json must agree with the plan files it describes."""
    out: list[Violation] = []
    for it in summary.iterations:
        plan = plans.get(it.iteration)
        if plan is None:
            out.append(Violation(file, "summary", f"iteration {it.iteration} has no plan file"))
            continue
        if it.strategy != plan.strategy:
            out.append(Violation(file, "summary",
                                 f"iteration {it.iteration}: strategy {it.strategy!r}, plan has {plan.strategy!r}"))
        if not close(it.estimate_s, plan.estimate.propagation_s):
            out.append(Violation(
                file, "summary",
                f"iteration {it.iteration}: estimate_s {it.estimate_s!r}, plan has {plan.estimate.propagation_s!r}",
            ))
        for name, got, want in (("iteration_s", it.iteration_s, plan.estimate.iteration_s),
                                ("sync_s", it.sync_s, plan.estimate.sync_s)):
            if got is not None and (want is None or not close(got, want)):
                out.append(Violation(file, "summary", f"iteration {it.iteration}: {name} {got!r}, plan has {want!r}"))
    return out


def _same_run(plan: Plan, views: Views, file: str) -> None:
    """UserError for a plan made for another profile, or for a job size the profile cannot lay out: every
    check after that would fail for the same reason, so validating stops at the first such file."""
    if plan.profile != views.profile.name:
        raise UserError(f"{file}: field profile: the plan is for profile {plan.profile!r}, not {views.profile.name!r} "
                        f"(pass --profile {plan.profile})")
    cluster = views.of(plan.gpus)
    if isinstance(cluster, UserError):
        raise UserError(f"{file}: field gpus: {plan.gpus}: {cluster}")


def validate_path(path: str | Path, profile: Profile, gpus_per_node: int | None = None) -> ValidationReport:
    """Validate one plan file, or a run folder (its plans in either form, and summary.json/strategies.json if
    present). A plan for another profile or job size is a UserError (`_same_run`), not a violation per file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    files = plan_files(path) if path.is_dir() else [path]
    if not files:
        raise UserError(f"{path}: no iter_NNNNNN.json (or .parquet) plan files in this folder")
    report = ValidationReport()
    views = Views(profile)
    strategies = None
    if path.is_dir() and (path / STRATEGIES_FILE).exists():
        strategies = load_model(Strategies, path / STRATEGIES_FILE)
    plans: dict[int, Plan] = {}
    for f in files:
        plan = read_plan(f)
        name = str(f)
        _same_run(plan, views, name)
        report.plans += 1
        report.pipelines += len(plan.pipelines)
        report.micro_batches += sum(len(p.micro_batches) for p in plan.pipelines)
        report.violations += check_plan(plan, views, name, gpus_per_node)
        number = PLAN_FILE.match(f.name)
        if number and int(number.group(1)) != plan.iteration:
            said = int(number.group(1))
            report.violations.append(Violation(name, "iteration", f"file name says {said}, plan says {plan.iteration}"))
        if strategies is not None:
            report.violations += check_against_strategies(plan, strategies, name)
        plans[plan.iteration] = plan
    if strategies is not None and strategies.gpus is not None and isinstance(cluster := views.of(strategies.gpus), Cluster):
        longest = max((s.length for p in plans.values() for s in p.batch), default=0)  # the context: as given, else
        context = strategies.model_copy(update={"context_len": strategies.context_len or longest})  # the longest planned
        report.violations += [Violation(str(path / STRATEGIES_FILE), "context", message, severity="warning")
                              for _, message in short_candidates(context, cluster)]
    if path.is_dir() and (path / SUMMARY_FILE).exists():
        summary = path / SUMMARY_FILE
        report.violations += check_summary(load_model(Summary, summary), plans, str(summary))
    return report
