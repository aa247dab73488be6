"""The planning commands: propose, pack, validate, compare."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hydraplan.app import cliopts
from hydraplan.app.cliopts import console, err_console, json_option, positive
from hydraplan.app.config import PackConfig, ProposeConfig
from hydraplan.methods.compare_config import CompareConfig
from hydraplan.methods.registry import NAMES as METHOD_NAMES
from hydraplan.methods.registry import OPT_IN as OPT_IN_METHODS

if TYPE_CHECKING:  # the commands import what they run when they run: `hydraplan --help` stays fast
    from hydraplan.core.schema import IterationSummary, Summary


@cliopts.config_command(ProposeConfig, json_out=(bool, json_option("print the strategies file instead of the table")))
def propose(config: ProposeConfig, json_out: bool) -> None:
    """Propose candidate strategies (Hydraulis §7): interval DP over the length distribution, its continuous
    relaxation rounded to integer strategies for every L' <= context length, plus the homogeneous fallback.

    The candidates are written with concrete ranks (TP, then CP groups inside a node) to OUT.
    """
    from rich.table import Table

    from hydraplan.core.cluster import Cluster
    from hydraplan.solve.proposal import propose as run_propose
    from hydraplan.solve.proposal import strategy_label
    from hydraplan.store.datasets import load_dataset
    from hydraplan.store.fileio import model_json, write_model
    from hydraplan.store.profiles import load_profile

    out = cliopts.out_file(config.out)
    cluster = Cluster.of(load_profile(config.profile), config.gpus, config.objective)
    ds = load_dataset(config.dataset, config.context_len)
    length = config.context_len or int(ds.lengths.max())
    strategies = run_propose(cluster, ds, length, gpus_per_node=config.gpus_per_node,
                             tokens_per_iter=config.tokens_per_iter, max_candidates=config.max_candidates)
    write_model(out, strategies)
    if json_out:
        typer.echo(model_json(strategies))
        return
    labels = [strategy_label(c) for c in strategies.candidates]
    table = Table(title=f"{cluster.name}, {config.gpus} GPUs, {ds.name}, context {length:,}", title_justify="left")
    table.add_column("name")
    table.add_column("strategy")
    for header in ("GPUs", "longest seq", "expected s/Mtok", "optimal for L'", "P(iter max in L')", "from"):
        table.add_column(header, justify="right" if header != "from" else "left")
    for c, label in zip(strategies.candidates, labels, strict=True):
        assert c.optimal_for is not None and c.max_len is not None and c.expected_s_per_token is not None  # proposed
        lo, hi = c.optimal_for
        extra = c.model_extra or {}  # the proposal's own fields (strategies.json keeps them as written)
        table.add_row(c.name, label, str(c.gpus), f"{c.max_len:,}", f"{c.expected_s_per_token * 1e6:.3f}",
                      f"{lo:,}-{hi:,}", f"{extra['p_longest']:.3f}", ", ".join(s.split("-")[0] for s in extra["sources"]))
    cliopts.print_table(table)
    console.print(f"wrote {out}")


@cliopts.config_command(PackConfig, json_out=(bool, json_option("print summary.json instead of the summary lines")))
def pack(config: PackConfig, json_out: bool) -> None:
    """Plan every iteration: dispatch to pipelines, pack micro-batches, keep the fastest candidate.

    Plans are written atomically in iteration order and do not depend on --workers.

    Without --resume an existing run in OUT is replaced; with it, planning continues after the last complete iteration.
    OUT is locked while the run lasts: a second run on it is refused.
    """
    from hydraplan.app.pack import run_pack
    from hydraplan.store.fileio import model_json

    progress = PackBar(config.out, compile_note())
    with progress.bar, cliopts.Heartbeat(progress.line):
        summary = run_pack(config, progress)
    if json_out:
        typer.echo(model_json(summary))
        return
    print_pack_summary(summary, config.out)


def compile_note() -> str | None:
    """The first run after an install compiles the solvers for about a minute: the line that says so, not to be
    taken for a hang. Looked at before anything compiles; printed when planning starts, so bad input still fails
    in one line."""
    from hydraplan.solve.jitcache import solvers_cached

    return None if solvers_cached() else "hydraplan: compiling solvers, once per install (about a minute)"


class PackBar:
    """pack's progress: a bar on a terminal (iterations/s, the running mean estimate), a line in logs."""

    def __init__(self, out: Path, note: str | None = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.out, self.note = out, note  # the compile note, said when planning starts
        self.done: int | None = None
        self.total: int | None = None
        self._hint()
        self.bar = Progress(TextColumn("pack"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                            TextColumn("mean estimate {task.fields[mean]}"), TimeRemainingColumn(), console=err_console,
                            disable=not err_console.is_terminal)  # logs get the final summary line, not bar frames

    def start(self, done: int, total: int) -> None:
        if self.note:
            err_console.print(self.note, soft_wrap=True)
        self.task = self.bar.add_task("pack", total=total, completed=done, rate="", mean="-")
        self.t0, self.n, self.sum = self.bar.get_time(), 0, 0.0
        self.done, self.total = done, total
        self._hint()

    def advance(self, it: IterationSummary) -> None:
        self.n += 1
        self.done = (self.done or 0) + 1
        self.sum += it.iteration_s if it.iteration_s is not None else it.estimate_s
        rate = self.n / max(self.bar.get_time() - self.t0, 1e-9)
        self.bar.update(self.task, advance=1, rate=f"{rate:.2f} it/s", mean=f"{self.sum / self.n:.3f} s")
        self._hint()

    def _hint(self) -> None:
        """What the interrupted-run line adds: the plans on disk and how to continue."""
        written = "" if self.total is None else f"{self.done} of {self.total} iterations planned; "
        cliopts.on_interrupt(f"{written}the plans written stay in {self.out}; run the same command with --resume "
                             "to continue")

    def line(self) -> str:
        if self.total is None:
            return "pack: preparing (dataset, static baseline, candidates)"
        return f"pack: {self.done}/{self.total} iterations planned into {self.out}"


def _groups(summary: Summary) -> str:
    outside = f", {summary.groups_outside_family} outside them" if summary.groups_outside_family else ""
    used = cliopts.plural(summary.new_process_groups, "process group")
    return (f"{used} used of the {summary.startup_process_groups} made at start-up "
            f"({summary.process_groups_per_rank} per rank at most){outside}")


def _slower(ratio: float) -> str:
    """The baseline's time over hydraplan's, in words: `1.39x slower`, or `1.28x faster` below 1."""
    return f"{ratio:.2f}x slower" if ratio >= 1 else f"{1 / ratio:.2f}x faster"


def print_pack_summary(summary: Summary, out: Path) -> None:
    if summary.empty_documents:  # the dataset first, then the plans (whose two lines end the output)
        console.print(f"skipped {summary.empty_documents:,} empty documents (0 tokens) of {summary.dataset}", soft_wrap=True)
    if summary.truncated_documents:
        console.print(f"truncated {summary.truncated_documents:,} documents of {summary.dataset} to the context length "
                      f"{summary.context_len:,}", soft_wrap=True)
    its = summary.iterations
    order = {c.name: k for k, c in enumerate(its[0].candidates)} if its else {}  # strategies.json order: S2 before S10
    chosen = sorted({i.strategy for i in its if not i.strategy.startswith("batch:")}, key=lambda n: (order.get(n, len(order)), n))
    made = f", {summary.synthesized_iterations} made for their batch" if summary.synthesized_iterations else ""
    e2e = "" if summary.mean_iteration_s is None else f"{summary.mean_iteration_s:.4f} s end to end, "
    console.print(f"planned {cliopts.plural(len(its), 'iteration')} into {out} ({summary.objective} objective): mean estimate "
                  f"{e2e}{summary.mean_estimate_s:.4f} s propagation, candidates used {', '.join(chosen) or 'none'}{made}; "
                  f"{_groups(summary)}", soft_wrap=True)
    if (summary.mean_baseline_s is not None and summary.mean_baseline_iteration_s is not None
            and summary.mean_iteration_s is not None and summary.mean_estimate_s is not None):
        console.print(f"static baseline {summary.baseline} (max-length FFD packing) on the same batches: "
                      f"{summary.mean_baseline_iteration_s:.4f} s end to end, "
                      f"{_slower(summary.mean_baseline_iteration_s / summary.mean_iteration_s)} "
                      f"({summary.mean_baseline_s:.4f} s propagation, "
                      f"{summary.mean_baseline_s / summary.mean_estimate_s:.2f}x)", soft_wrap=True)

    delay = summary.outlier_delay
    if delay is not None and delay.avg_delay_iters_per_token is not None:
        console.print(f"outlier delay: sequences over {delay.threshold} tokens queued, average delay "
                      f"{delay.avg_delay_iters_per_token:.3f} iterations per token", soft_wrap=True)


def validate(
    path: Path = typer.Argument(..., help="a run folder or one iter_NNNNNN.json plan"),
    profile: str = typer.Option(..., "--profile", help="the profile the plans were made with"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="node size for the placement warnings "
                                             "(default: the profile's)"),
    json_out: bool = json_option("machine-readable report"),
) -> None:
    """Check plans against every constraint of docs/formats.md and recompute every estimate; exit 1 on a violation.

    Warnings (exit 0): TP or CP groups that span nodes although they fit in one, and candidates whose
    largest MaxLen is below the run's context length."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from hydraplan.app.validate import validate_path
    from hydraplan.store.profiles import load_profile

    positive(gpus_per_node, "--gpus-per-node")
    report = validate_path(path, load_profile(profile), gpus_per_node)
    if json_out:
        console.print_json(json.dumps({
            "ok": report.ok, "plans": report.plans, "pipelines": report.pipelines,
            "micro_batches": report.micro_batches, "violations": [asdict(v) for v in report.errors],
            "warnings": [asdict(v) for v in report.warnings],
        }))
    else:
        if report.violations:
            table = Table("file", "pipeline", "micro-batch", "kind", "problem")
            for v in report.violations:
                table.add_row(v.file, "" if v.pipeline is None else str(v.pipeline),
                              "" if v.micro_batch is None else str(v.micro_batch),
                              v.kind + (" (warning)" if v.severity == "warning" else ""), v.message)
            cliopts.print_table(table)
        warned = f" ({cliopts.plural(len(report.warnings), 'warning')})" if report.warnings else ""
        if report.ok:
            console.print(f"OK: {cliopts.plural(report.plans, 'plan')}, {cliopts.plural(report.pipelines, 'pipeline')}, "
                          f"{cliopts.plural(report.micro_batches, 'micro-batch', 'micro-batches')} satisfy every "
                          f"constraint{warned}")
        else:
            console.print(f"{cliopts.plural(len(report.errors), 'violation')} in {cliopts.plural(report.plans, 'plan')}"
                          f"{warned}")
    if not report.ok:
        raise typer.Exit(1)


@cliopts.config_command(
    CompareConfig,
    out=(Path, typer.Option(..., "--out", help="report folder: compare.json, report.html, *.png")),
    methods=(list[str] | None, typer.Option(
        None, "--methods", help=f"methods to run (repeat the option; default all): {' '.join(METHOD_NAMES)}; opt-in: "
        f"Megatron's schedulers and hydraplan's on Megatron's seams, {' '.join(OPT_IN_METHODS)}")),
    json_out=(bool, json_option("print compare.json instead of the table")),
)
def compare(config: CompareConfig, out: Path, methods: list[str] | None, json_out: bool) -> None:
    """Compare hydraplan with Megatron-LM, HotSPa, WLB-LLM, FlexSP and the Hydraulis ablations on the
    same sampled batches and the same cost model; write compare.json, PNG plots and report.html.

    Static baselines get their best scheme, tuned on the compared batches themselves.
    """
    from rich import box
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Column, Table

    from hydraplan.app.report import STDOUT_COLUMNS, TABLE_HEADER, table_rows, wlb_line, write_report
    from hydraplan.methods.compare import run_compare
    from hydraplan.store.fileio import model_json
    from hydraplan.store.runlock import locked_folder

    if methods is not None:  # a list of names, spaced or comma-separated, in one option or repeated
        config = config.model_copy(update={"methods": tuple(m for part in methods for m in part.replace(",", " ").split())})
    bar = Progress(TextColumn("compare"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[what]}"),
                   TimeElapsedColumn(), console=err_console,
                   disable=not err_console.is_terminal)  # logs get the table, not bar frames

    class _Progress:
        done: int = 0
        total: int | None = None
        note = compile_note()  # said when the comparison starts, so bad input still fails in one line

        def start(self, total: int) -> None:
            if self.note:
                err_console.print(self.note, soft_wrap=True)
            self.task = bar.add_task("compare", total=total, what="")
            self.done, self.total = 0, total

        def advance(self, what: str) -> None:
            bar.update(self.task, advance=1, what=what)
            self.done += 1

        def line(self) -> str:
            return "compare: preparing" if self.total is None else f"compare: {self.done}/{self.total} steps"

    progress = _Progress()
    with locked_folder(out, "--out"), bar, cliopts.Heartbeat(progress.line):
        outcome = run_compare(config, progress)
        paths = write_report(outcome, out)
    if json_out:
        console.print_json(model_json(outcome.result))
        return
    r = outcome.result
    rows = table_rows(r)
    columns = [Column(TABLE_HEADER[i]) for i in STDOUT_COLUMNS]
    table = Table(*columns, box=box.SIMPLE_HEAD, title=f"{r.profile} {r.dataset} {r.gpus} GPUs "
                  f"{r.tokens_per_iter} tokens/iter context {r.context_len}, {r.iterations} iterations, {r.objective} objective")
    for row in rows:
        table.add_row(*(row[i] for i in STDOUT_COLUMNS))
    cliopts.print_table(table, piped_width=120)  # not 80 columns in logs: 9 columns
    line = wlb_line(r)
    if line:
        console.print(line)
    console.print(f"wrote {paths['report.html']} and {paths['compare.json']}")
