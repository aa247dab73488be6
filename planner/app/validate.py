"""Plan validation: every constraint of docs/formats.md, and every estimate recomputed with the canonical model.

Pure checks (`check_plan`, `check_ranks`) return Violations instead of raising, so one run reports
everything that is wrong at once; `validate_path` is the I/O edge used by `hydraplan validate`.
Unreadable input (missing file, bad JSON, schema mismatch) is a UserError, i.e. exit 2, not a violation.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hydraplan.core.cluster import for_gpus
from hydraplan.core.cost import pipeline_time_from_mb, seq_cost
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Plan, PlanPipeline, Profile, Scheme, Strategies, Summary
from hydraplan.core.sync import has_sync_model, iteration_estimate
from hydraplan.store.fileio import load_model

REL_TOL = 1e-6
PLAN_FILE = re.compile(r"^iter_(\d+)\.json$")


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


def check_ranks(ranks_per_pipeline: Sequence[Sequence[int]], gpus: int) -> list[tuple[int, str]]:
    """(pipeline index, problem) for ranks out of [0, gpus) or shared between/within pipelines."""
    problems: list[tuple[int, str]] = []
    owner: dict[int, int] = {}
    for p, ranks in enumerate(ranks_per_pipeline):
        bad = sorted({r for r in ranks if not 0 <= r < gpus})
        if bad:
            problems.append((p, f"ranks {bad} out of range [0, {gpus})"))
        for r, n in sorted(Counter(ranks).items()):
            if n > 1:
                problems.append((p, f"rank {r} listed {n} times"))
        for r in sorted(set(ranks)):
            if r in owner and owner[r] != p:
                problems.append((p, f"rank {r} also used by pipeline {owner[r]}"))
            owner.setdefault(r, p)
    return problems


def split_groups(ranks: Sequence[int], tp: int, pp: int, cp: int, gpus_per_node: int) -> list[str]:
    """TP and CP groups of one pipeline (ranks[(s*cp + c)*tp + t], docs/formats.md) that cross a node boundary
    although they could sit in one node: their collectives then run on the inter-node network every
    layer, which the profile's times do not model. A TP group wider than a node, or a CP group whose
    stage block (tp*cp ranks) is, must span nodes and is not reported."""
    if len(ranks) != tp * pp * cp or gpus_per_node < 1:
        return []
    out = []

    def check(kind: str, s: int, group: list[int]) -> None:
        nodes = sorted({r // gpus_per_node for r in group})
        if len(nodes) > 1:
            out.append(f"stage {s} {kind} group on ranks {group} spans nodes {nodes} ({gpus_per_node} GPUs per node)")

    for s in range(pp):
        if tp > 1 and tp <= gpus_per_node:
            for c in range(cp):
                check("TP", s, list(ranks[(s * cp + c) * tp:(s * cp + c + 1) * tp]))
        if cp > 1 and tp * cp <= gpus_per_node:
            for t in range(tp):
                check("CP", s, [ranks[(s * cp + c) * tp + t] for c in range(cp)])
    return out


def short_candidates(strategies: Strategies, profile: Profile) -> list[tuple[int, str]]:
    """(candidate index, message) for candidates whose largest MaxLen is below the run's context length:
    they can never plan an iteration that holds a sequence of that length. Proposed candidates meant for
    shorter iterations (their optimal_for range ends within their MaxLen) are not reported."""
    if strategies.context_len is None or strategies.gpus is None:
        return []
    try:
        schemes = {s.key: s for s in for_gpus(profile, strategies.gpus).schemes}
    except UserError:
        return []
    out = []
    for i, cand in enumerate(strategies.candidates):
        lens = [schemes[p.key].max_len for p in cand.pipelines if p.key in schemes]
        longest = cand.max_len if cand.max_len is not None else max(lens, default=0)
        if cand.optimal_for is not None and cand.optimal_for[1] <= longest:
            continue  # proposed for shorter iterations (its L' range ends where it fits): by design
        if longest < strategies.context_len:
            out.append((i, f"candidate {cand.name} holds at most {longest} tokens, below the context length "
                           f"{strategies.context_len}: it can only plan iterations without such a sequence"))
    return out


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


def check_plan(plan: Plan, profile: Profile, file: str = "<plan>", gpus_per_node: int | None = None) -> list[Violation]:
    """Every constraint of the plan contract, and the canonical estimates recomputed; TP/CP groups that
    span nodes are warnings (`split_groups`, node size default: the profile's)."""
    out: list[Violation] = []

    def bad(kind: str, message: str, pipeline: int | None = None, mb: int | None = None) -> None:
        out.append(Violation(file, kind, message, pipeline, mb))

    if plan.profile != profile.name:
        bad("profile", f"plan is for profile {plan.profile!r}, checked against {profile.name!r}")
    try:
        schemes = {s.key: s for s in for_gpus(profile, plan.gpus).schemes}
    except UserError as e:
        bad("scheme", str(e))
        schemes = {}

    lengths: dict[int, int] = {}
    for s in plan.batch:
        if s.id in lengths:
            bad("batch", f"sequence id {s.id} listed twice in the batch")
        lengths[s.id] = s.length
        if s.sampled_iteration is not None and s.sampled_iteration > plan.iteration:
            bad("batch", f"sequence id {s.id} is trained in iteration {plan.iteration} before it is sampled "
                         f"(sampled_iteration {s.sampled_iteration})")

    used = sum(p.tp * p.pp * p.cp for p in plan.pipelines)
    if used > plan.gpus:
        bad("gpus", f"pipelines use {used} GPUs, the plan has {plan.gpus}")
    for p, pipe in enumerate(plan.pipelines):
        if len(pipe.ranks) != pipe.tp * pipe.pp * pipe.cp:
            bad("ranks", f"{len(pipe.ranks)} ranks for tp*pp*cp = {pipe.tp * pipe.pp * pipe.cp} GPUs", p)
    for p, problem in check_ranks([pipe.ranks for pipe in plan.pipelines], plan.gpus):
        bad("ranks", problem, p)
    node = gpus_per_node or profile.gpu.gpus_per_node
    for p, pipe in enumerate(plan.pipelines):
        for problem in split_groups(pipe.ranks, pipe.tp, pipe.pp, pipe.cp, node):
            out.append(Violation(file, "placement", problem, p, severity="warning"))

    if plan.cad is not None:
        out.extend(_check_cad(plan, profile, lengths, file))
        return out

    where: dict[int, list[tuple[int, int]]] = defaultdict(list)
    pipeline_estimates: list[float] = []
    for p, pipe in enumerate(plan.pipelines):
        scheme: Scheme | None = schemes.get(pipe.key)
        label = f"<{pipe.tp},{pipe.pp},{pipe.cp}>"
        if scheme is None:
            bad("scheme", f"scheme {label} is not in profile {profile.name} for {plan.gpus} GPUs", p)
        capacity = None if scheme is None else _capacity(pipe, scheme, lambda m: bad("seq1f1b", m, p))
        mb_times: list[float] = []
        for m, mb in enumerate(pipe.micro_batches):
            known = [i for i in mb.seqs if i in lengths]
            for i in mb.seqs:
                where[i].append((p, m))
                if i not in lengths:
                    bad("coverage", f"sequence id {i} is not in the batch", p, m)
            mb_lengths = np.array([lengths[i] for i in known], dtype=np.int64)
            if scheme is not None:
                tokens = int(mb_lengths.sum())
                if tokens > capacity:
                    bad("capacity", f"{tokens} tokens > max_len {capacity} of {label} at {plan.gpus} GPUs", p, m)
                mb_times.append(float(seq_cost(scheme, mb_lengths).sum()) + scheme.time.c)
        if scheme is None:
            continue
        expected = pipeline_time_from_mb(mb_times, scheme.pp)
        pipeline_estimates.append(expected)
        if not close(pipe.estimate_s, expected):
            bad("estimate", f"estimate_s {pipe.estimate_s!r}, the canonical estimate is {expected!r}", p)

    for i in lengths:
        places = where.get(i, [])
        if not places:
            bad("coverage", f"sequence id {i} (length {lengths[i]}) is in no micro-batch")
        elif len(places) > 1:
            at = ", ".join(f"pipeline {p} micro-batch {m}" for p, m in places)
            bad("coverage", f"sequence id {i} is in {len(places)} micro-batches ({at})", *places[1])

    if len(pipeline_estimates) == len(plan.pipelines):
        expected = max(pipeline_estimates, default=0.0)
        if not close(plan.estimate.propagation_s, expected):
            bad("estimate", f"propagation_s {plan.estimate.propagation_s!r}, the max over pipelines is {expected!r}")
        out += check_sync(plan, profile, pipeline_estimates, file)
    return out


def check_sync(plan: Plan, profile: Profile, propagation: list[float], file: str) -> list[Violation]:
    """The docs/formats.md end-to-end fields recomputed from the pipelines' canonical estimates: required when the
    profile has a sync model, and checked whenever present (without a model the sync is 0)."""
    out: list[Violation] = []
    required = has_sync_model(profile)
    est = iteration_estimate(profile, plan.gpus, [p.key for p in plan.pipelines], propagation)
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


def _check_cad(plan: Plan, profile: Profile, lengths: dict[int, int], file: str) -> list[Violation]:
    """A core-attention disaggregation plan (hydraplan.cad): pieces cover every sequence once, tasks cover
    every query once, replicas hold at most MaxLen tokens per step, and the CAD estimate recomputes."""
    from hydraplan.solve.cad import estimate

    assert plan.cad is not None
    out: list[Violation] = []
    try:
        view = for_gpus(profile, plan.gpus)
    except UserError as e:
        return [Violation(file, "scheme", str(e))]
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
    want = [(p.tp, p.pp, p.cp, p.ranks) for p in cand.pipelines]
    got = [(p.tp, p.pp, p.cp, p.ranks) for p in plan.pipelines]
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


def plan_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if PLAN_FILE.match(p.name))


def validate_path(path: str | Path, profile: Profile, gpus_per_node: int | None = None) -> ValidationReport:
    """Validate one plan file, or a run folder (its plans, and summary.json/strategies.json if present)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    files = plan_files(path) if path.is_dir() else [path]
    if not files:
        raise UserError(f"{path}: no iter_NNNNNN.json plan files in this folder")
    report = ValidationReport()
    strategies = None
    if path.is_dir() and (path / "strategies.json").exists():
        strategies = load_model(Strategies, path / "strategies.json")
    plans: dict[int, Plan] = {}
    for f in files:
        plan = load_model(Plan, f)
        name = str(f)
        report.plans += 1
        report.pipelines += len(plan.pipelines)
        report.micro_batches += sum(len(p.micro_batches) for p in plan.pipelines)
        report.violations += check_plan(plan, profile, name, gpus_per_node)
        number = PLAN_FILE.match(f.name)
        if number and int(number.group(1)) != plan.iteration:
            said = int(number.group(1))
            report.violations.append(Violation(name, "iteration", f"file name says {said}, plan says {plan.iteration}"))
        if strategies is not None:
            report.violations += check_against_strategies(plan, strategies, name)
        plans[plan.iteration] = plan
    if strategies is not None:  # the context: as given to the run, else the longest sequence it planned
        longest = max((s.length for p in plans.values() for s in p.batch), default=0)
        context = strategies.model_copy(update={"context_len": strategies.context_len or longest})
        report.violations += [Violation(str(path / "strategies.json"), "context", message, severity="warning")
                              for _, message in short_candidates(context, profile)]
    if path.is_dir() and (path / "summary.json").exists():
        summary = path / "summary.json"
        report.violations += check_summary(load_model(Summary, summary), plans, str(summary))
    return report
