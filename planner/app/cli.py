"""The `hydraplan` command line: thin typer commands that call into the planner modules."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from hydraplan.app import cliopts
from hydraplan.app.cliopts import CONTEXT_SETTINGS, check_context_len, context_len_option, json_option, positive, workers_option
from hydraplan.core.errors import UserError

app = typer.Typer(
    help="Plan heterogeneous, length-aware LLM training: propose strategies, pack iterations, compare.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings=CONTEXT_SETTINGS,
)
profiles_app = typer.Typer(help="Bundled GPU profiles (cost model per <TP,PP,CP> scheme).", no_args_is_help=True,
                           context_settings=CONTEXT_SETTINGS)
dataset_app = typer.Typer(help="Sequence-length datasets.", no_args_is_help=True, context_settings=CONTEXT_SETTINGS)
app.add_typer(profiles_app, name="profiles")
app.add_typer(dataset_app, name="dataset")

console = Console()
err_console = Console(stderr=True)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=cliopts.version_callback, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """Plan heterogeneous, length-aware LLM training: propose strategies, pack iterations, compare."""


@app.command()
def schema(
    out_dir: Path | None = typer.Option(None, "--out", help="folder to write <name>.schema.json into"),
    json_out: bool = json_option('print {"<name>": <JSON Schema>, ...} instead of writing files'),
) -> None:
    """Write the JSON Schemas of every file format (profile, strategies, plan, summary)."""
    import json

    from hydraplan.core.schema import SCHEMAS
    from hydraplan.store.fileio import atomic_write_text

    schemas = {name: model.model_json_schema(by_alias=True) for name, model in SCHEMAS.items()}
    if out_dir is None and not json_out:
        raise UserError("schema: pass --out DIR (write the files) or --json (print them)")
    if out_dir is not None:
        cliopts.out_folder(out_dir)
        for name, doc in schemas.items():
            path = out_dir / f"{name}.schema.json"
            atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
            if not json_out:
                console.print(f"wrote {path}")
    if json_out:
        typer.echo(json.dumps(schemas, indent=1))


@app.command()
def propose(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile JSON"),
    dataset: str = typer.Option(..., "--dataset", help="length file or builtin:wikipedia / builtin:prolong"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job"),
    out: Path = typer.Option(..., "--out", help="strategies file to write (hydraplan.strategies/v1)"),
    context_len: int | None = context_len_option(),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="node size for rank placement "
                                             "(default: the profile's)"),
    tokens_per_iter: int | None = typer.Option(None, "--tokens-per-iter", help="nominal batch the expected cost is "
                                               "taken on (default: 4096 per GPU)"),
    max_candidates: int | None = typer.Option(None, "--max-candidates", help="keep at most this many candidates, "
                                              "preferring the L' ranges that most often hold an iteration's longest "
                                              "sequence (0: all; default: all while candidates x sequences per "
                                              "iteration <= 1M, e.g. all at 64-1024 GPUs, 37 at 8192 GPUs / 25M tokens)"),
    json_out: bool = json_option("print the strategies file instead of the table"),
    objective: str = typer.Option("end-to-end", "--objective", help="what to minimize: end-to-end (propagation + exposed "
                                  "LNK pull/push, docs/formats.md) or propagation (the paper's objective)"),
) -> None:
    """Propose candidate strategies (Hydraulis §7): interval DP over the length distribution, its continuous
    relaxation rounded to integer strategies for every L' <= context length, plus the homogeneous fallback.

    The candidates are written with concrete ranks (TP, then CP groups inside a node) to OUT.
    """
    from rich.table import Table

    from hydraplan.solve.proposal import propose as run_propose
    from hydraplan.solve.proposal import strategy_label
    from hydraplan.store.datasets import load_dataset
    from hydraplan.store.fileio import model_json, write_model
    from hydraplan.store.profiles import load_profile

    positive(gpus, "--gpus")
    check_context_len(context_len)
    positive(gpus_per_node, "--gpus-per-node")
    positive(tokens_per_iter, "--tokens-per-iter")
    cliopts.out_file(out)
    prof = load_profile(profile)
    ds = load_dataset(dataset, context_len)
    length = context_len or int(ds.lengths.max())
    strategies = run_propose(prof, ds, gpus, length, gpus_per_node=gpus_per_node, tokens_per_iter=tokens_per_iter,
                             max_candidates=max_candidates, objective=objective)
    write_model(out, strategies)
    if json_out:
        typer.echo(model_json(strategies))
        return
    labels = [strategy_label(c) for c in strategies.candidates]
    table = Table(title=f"{prof.name}, {gpus} GPUs, {ds.name}, context {length:,}", title_justify="left")
    table.add_column("name")
    table.add_column("strategy", no_wrap=True, min_width=max(map(len, labels)))
    for header in ("GPUs", "longest seq", "expected s/Mtok", "optimal for L'", "P(iter max in L')", "from"):
        table.add_column(header, justify="right" if header != "from" else "left")
    for c, label in zip(strategies.candidates, labels, strict=True):
        lo, hi = c.optimal_for
        table.add_row(c.name, label, str(c.gpus), f"{c.max_len:,}", f"{c.expected_s_per_token * 1e6:.3f}",
                      f"{lo:,}-{hi:,}", f"{c.p_longest:.3f}", ", ".join(s.split("-")[0] for s in c.sources))
    # rich wraps to 80 columns when stdout is not a terminal; the strategy column needs more
    (console if console.is_terminal else Console(width=160)).print(table)
    console.print(f"wrote {out}")


@app.command()
def pack(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile JSON"),
    dataset: str = typer.Option(..., "--dataset", help="length file or builtin:wikipedia / builtin:prolong"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job"),
    tokens_per_iter: int = typer.Option(..., "--tokens-per-iter", help="token budget of one iteration's batch"),
    iterations: int = typer.Option(..., "--iterations", help="iterations to plan"),
    out: Path = typer.Option(..., "--out", help="run folder: iter_NNNNNN.json, strategies.json, summary.json"),
    strategies: Path | None = typer.Option(
        None, "--strategies", help="candidates (ranks optional); default: propose them. The static baseline's homogeneous "
        "layout joins as candidate 'static' unless present; the run's set is written to OUT/strategies.json"),
    context_len: int | None = context_len_option(),
    seed: int = typer.Option(0, "--seed", help="sampling and solver seed: same seed, same plans"),
    workers: int | None = workers_option(),
    dispatch: str = typer.Option("greedy", "--dispatch", help="greedy (Alg. 1 + local search) or ilp (Eq. 3, exact)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run (same arguments required)"),
    seq1f1b: str | None = typer.Option(
        None, "--seq1f1b", help="K|auto: plan Seq1F1B for pp > 1 pipelines (K sub-sequences per micro-batch; raises their "
        "MaxLen; plans record splits and seq1f1b_estimate_s)"),
    cp_shard: bool = typer.Option(False, "--cp-shard", help="record adaptive WLB-LLM CP sharding (per-rank token ranges) "
                                  "for cp > 1 pipelines"),
    outlier_delay: bool = typer.Option(
        False, "--outlier-delay", help="queue the rare long sequences and train them together once they hold an "
        "iteration's tokens (WLB-LLM outlier delay; plans record sampled_iteration, all drained by the last iteration)"),
    objective: str = typer.Option("end-to-end", "--objective", help="what to minimize: end-to-end (propagation + exposed "
                                  "LNK pull/push, docs/formats.md) or propagation (the paper's objective)"),
    no_static: bool = typer.Option(False, "--no-static", help="do not add the static baseline's layout as candidate "
                                   "'static' (so a hand-written --strategies file is used as given)"),
    synthesize: bool | None = typer.Option(
        None, "--synthesize/--candidates-only", help="also make a strategy for each batch from the any-strategy MILP "
        "(plans marked synthesized), or use only the candidates; default: made with --objective propagation, where it "
        "wins most iterations, not end to end, where it rarely does and costs 4-5x the planning time"),
    json_out: bool = json_option("print summary.json instead of the summary lines"),
    cad: bool = typer.Option(
        False, "--cad", help="also plan core-attention disaggregation (DistCA: attention tasks balanced across the "
        "replicas of one homogeneous layout) and keep it in iterations where it is faster; plans record `cad`"),
) -> None:
    """Plan every iteration: dispatch to pipelines, pack micro-batches, keep the fastest candidate.

    Plans are written atomically in iteration order and do not depend on --workers.

    Without --resume an existing run in OUT is replaced; with it, planning continues after the last complete iteration.
    OUT is locked while the run lasts: a second run on it is refused.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from hydraplan.core.schema import IterationSummary
    from hydraplan.engine.planner import PackOptions, run_pack
    from hydraplan.store.fileio import model_json

    for value, flag in ((gpus, "--gpus"), (tokens_per_iter, "--tokens-per-iter"), (iterations, "--iterations"),
                        (workers, "--workers")):
        positive(value, flag)
    check_context_len(context_len)
    opts = PackOptions(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens_per_iter,
                       iterations=iterations, out=out, strategies=strategies, context_len=context_len, seed=seed,
                       workers=workers, dispatch=dispatch, resume=resume, seq1f1b=seq1f1b,
                       cp_shard=cp_shard, outlier_delay=outlier_delay, objective=objective, static=not no_static,
                       synthesize=synthesize, cad=cad)  # type: ignore[arg-type]
    bar = Progress(TextColumn("pack"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TextColumn("mean estimate {task.fields[mean]}"), TimeRemainingColumn(), console=err_console,
                   disable=not err_console.is_terminal)  # logs get the final summary line, not bar frames

    class _Progress:
        """Iterations/s and the running mean estimate of this invocation."""

        done = total = None

        def start(self, done: int, total: int) -> None:
            self.task = bar.add_task("pack", total=total, completed=done, rate="", mean="-")
            self.t0, self.n, self.sum = bar.get_time(), 0, 0.0
            self.done, self.total = done, total

        def advance(self, it: IterationSummary) -> None:
            self.n += 1
            self.done += 1
            self.sum += it.iteration_s if it.iteration_s is not None else it.estimate_s
            rate = self.n / max(bar.get_time() - self.t0, 1e-9)
            bar.update(self.task, advance=1, rate=f"{rate:.2f} it/s", mean=f"{self.sum / self.n:.3f} s")

        def line(self) -> str:
            if self.total is None:
                return "pack: preparing (dataset, static baseline, candidates)"
            return f"pack: {self.done}/{self.total} iterations planned into {out}"

    progress = _Progress()
    cliopts.on_interrupt(f"the plans written so far stay in {out}; run the same command with --resume to continue")
    with bar, cliopts.Heartbeat(progress.line):
        summary = run_pack(opts, progress)
    if json_out:
        typer.echo(model_json(summary))
        return
    its = summary.iterations
    order = {c.name: k for k, c in enumerate(its[0].candidates)} if its else {}  # strategies.json order: S2 before S10
    chosen = sorted({i.strategy for i in its if not i.strategy.startswith("batch:")}, key=lambda n: (order.get(n, len(order)), n))
    made = f", {summary.synthesized_iterations} made for their batch" if summary.synthesized_iterations else ""
    e2e = "" if summary.mean_iteration_s is None else f"{summary.mean_iteration_s:.4f} s end to end, "
    console.print(f"planned {len(its)} iterations into {out} ({summary.objective} objective): mean estimate "
                  f"{e2e}{summary.mean_estimate_s:.4f} s propagation, candidates used {', '.join(chosen) or 'none'}{made}; "
                  f"{summary.new_process_groups} process groups", soft_wrap=True)
    if (summary.mean_baseline_s is not None and summary.mean_baseline_iteration_s is not None
            and summary.mean_iteration_s is not None):
        console.print(f"static baseline {summary.baseline} (max-length FFD packing) on the same batches: "
                      f"{summary.mean_baseline_iteration_s:.4f} s end to end, "
                      f"{summary.mean_baseline_iteration_s / summary.mean_iteration_s:.2f}x slower "
                      f"({summary.mean_baseline_s:.4f} s propagation, "
                      f"{summary.mean_baseline_s / summary.mean_estimate_s:.2f}x)", soft_wrap=True)
    if summary.empty_documents:
        console.print(f"skipped {summary.empty_documents:,} empty documents (0 tokens) of {summary.dataset}", soft_wrap=True)
    delay = summary.outlier_delay
    if delay is not None and delay.avg_delay_iters_per_token is not None:
        console.print(f"outlier delay: sequences over {delay.threshold} tokens queued, average delay "
                      f"{delay.avg_delay_iters_per_token:.3f} iterations per token", soft_wrap=True)


@app.command()
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
            console.print(table)
        warned = f" ({len(report.warnings)} warnings)" if report.warnings else ""
        if report.ok:
            console.print(f"OK: {report.plans} plans, {report.pipelines} pipelines, "
                          f"{report.micro_batches} micro-batches satisfy every constraint{warned}")
        else:
            console.print(f"{len(report.errors)} violations in {report.plans} plans{warned}")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def compare(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile JSON"),
    dataset: str = typer.Option(..., "--dataset", help="length file or builtin:wikipedia / builtin:prolong"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job"),
    tokens_per_iter: int = typer.Option(..., "--tokens-per-iter", help="token budget of one iteration's batch"),
    iterations: int = typer.Option(..., "--iterations", help="iterations to sample and compare"),
    out: Path = typer.Option(..., "--out", help="report folder: compare.json, report.html, *.png"),
    context_len: int | None = context_len_option(),
    seed: int = typer.Option(0, "--seed", help="sampling and solver seed"),
    methods: list[str] | None = typer.Option(
        None, "--methods", help="methods to run (repeat the option; default all): megatron hotspa wlb-llm wlb-nodelay flexsp "
        "homo-maxlen homo-pack hetero-static hydraplan hydraplan-delay cad hydraplan-cad"),
    json_out: bool = json_option("print compare.json instead of the table"),
    objective: str = typer.Option("end-to-end", "--objective", help="what to minimize: end-to-end (propagation + exposed "
                                  "LNK pull/push, docs/formats.md) or propagation (the paper's objective)"),
) -> None:
    """Compare hydraplan with Megatron-LM, HotSPa, WLB-LLM, FlexSP and the Hydraulis ablations on the
    same sampled batches and the same cost model; write compare.json, PNG plots and report.html.

    Static baselines get their best scheme, tuned on the compared batches themselves.
    """
    from rich import box
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Column, Table

    from hydraplan.app.report import STDOUT_COLUMNS, TABLE_HEADER, table_rows, wlb_line, write_report
    from hydraplan.methods.compare import ALL_METHODS, CompareOptions, run_compare
    from hydraplan.store.fileio import model_json
    from hydraplan.store.runlock import locked_folder

    for value, flag in ((gpus, "--gpus"), (tokens_per_iter, "--tokens-per-iter"), (iterations, "--iterations")):
        positive(value, flag)
    check_context_len(context_len)
    chosen = tuple(m for part in (methods or list(ALL_METHODS)) for m in part.replace(",", " ").split())
    opts = CompareOptions(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens_per_iter,
                          iterations=iterations, seed=seed, context_len=context_len, methods=chosen,
                          objective=objective)  # type: ignore[arg-type]
    bar = Progress(TextColumn("compare"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[what]}"),
                   TimeElapsedColumn(), console=err_console,
                   disable=not err_console.is_terminal)  # logs get the table, not bar frames

    class _Progress:
        done = total = None

        def start(self, total: int) -> None:
            self.task = bar.add_task("compare", total=total, what="")
            self.done, self.total = 0, total

        def advance(self, what: str) -> None:
            bar.update(self.task, advance=1, what=what)
            self.done += 1

        def line(self) -> str:
            return "compare: preparing" if self.total is None else f"compare: {self.done}/{self.total} steps"

    progress = _Progress()
    with locked_folder(out), bar, cliopts.Heartbeat(progress.line):
        outcome = run_compare(opts, progress)
        paths = write_report(outcome, out)
    if json_out:
        console.print_json(model_json(outcome.result))
        return
    r = outcome.result
    columns = [Column(TABLE_HEADER[i], no_wrap=True, overflow="ellipsis", max_width=18 if i == 1 else None)
               for i in STDOUT_COLUMNS]
    table = Table(*columns, box=box.SIMPLE_HEAD, title=f"{r.profile} {r.dataset} {r.gpus} GPUs "
                  f"{r.tokens_per_iter} tokens/iter context {r.context_len}, {r.iterations} iterations, {r.objective} objective")
    for row in table_rows(r):
        table.add_row(*(row[i] for i in STDOUT_COLUMNS))
    (console if console.is_terminal else Console(width=120)).print(table)  # not 80 columns in logs: 9 columns
    line = wlb_line(r)
    if line:
        console.print(line)
    console.print(f"wrote {paths['report.html']} and {paths['compare.json']}")


# The simulator executes ~30K actions per second: the limit answers in seconds (256 stages x 4096
# micro-batches, 2M actions, took a silent minute).
MAX_PIPELINE_ACTIONS = 100_000


@app.command()
def pipeline(
    schedule: str = typer.Option(..., "--schedule", help="1f1b | interleaved | seq1f1b | seq1f1b-interleaved"),
    stages: int = typer.Option(..., "--stages", help="pipeline stages P (devices)"),
    micro_batches: int = typer.Option(..., "--micro-batches", help="micro-batches M"),
    splits: int = typer.Option(4, "--splits", help="Seq1F1B sub-sequences per micro-batch K (seq1f1b kinds)"),
    chunks: int = typer.Option(2, "--chunks", help="model chunks per device V (interleaved kinds)"),
    json_out: bool = json_option('print {"stages": [[{"op","mb","split","chunk"}, ...], ...], ...}'),
    plot: Path | None = typer.Option(None, "--plot", help="also draw the timeline (Gantt) as a PNG"),
) -> None:
    """Per-stage action lists of a pipeline schedule, checked for deadlock by executing them, with the
    bubble ratio and peak live activations for uniform micro-batches (T = 1 per micro-batch and stage,
    forward 1/3, backward 2/3). Actions read F3 (forward of micro-batch 3), F3.1 (its split 1), F3c1 (chunk 1).
    """
    import json

    from rich.table import Table

    from hydraplan.app.plots import plot_timeline
    from hydraplan.core.schedules import action_label, forwards_before_first_backward, make_schedule, unit_timeline

    if plot is not None:
        cliopts.png_file(plot)
    for value, flag in ((stages, "--stages"), (micro_batches, "--micro-batches"), (splits, "--splits"), (chunks, "--chunks")):
        positive(value, flag)
    k = splits if schedule.startswith("seq1f1b") else 1
    v = chunks if schedule.endswith("interleaved") else 1
    actions = 2 * stages * micro_batches * k * v
    if actions > MAX_PIPELINE_ACTIONS:
        raise UserError(f"pipeline: {stages} stages x {micro_batches} micro-batches x {k} splits x {v} chunks is "
                        f"{actions:,} forward and backward actions; at most {MAX_PIPELINE_ACTIONS:,} are simulated "
                        "(a few seconds); lower --stages or --micro-batches")
    sch = make_schedule(schedule, stages, micro_batches, splits, chunks)
    tl = unit_timeline(sch)
    if plot is not None:
        plot_timeline(tl, plot, unit="T")
    live_mb = [round(b, 4) for b in tl.peak_live_bytes or []]
    if json_out:
        out = sch.to_json() | {"schedule": sch.name, "P": sch.P, "M": sch.M, "K": sch.K, "V": sch.V,
                               "latency": tl.latency_s, "bubble_ratio": tl.bubble_ratio,
                               "peak_live": tl.peak_live, "peak_live_micro_batches": live_mb}
        typer.echo(json.dumps(out, indent=1))  # rich's print_json highlights: minutes for 100K actions
        return
    table = Table("stage", "F before 1st B", "peak live", "peak live (micro-batches)", "actions",
                  title=f"{sch.name} P={sch.P} M={sch.M} K={sch.K} V={sch.V}")
    for r, acts in enumerate(sch.stages):
        table.add_row(str(r), str(forwards_before_first_backward(sch.P, sch.M, sch.K, sch.V, r)), str(tl.peak_live[r]),
                      f"{live_mb[r]:g}", " ".join(action_label(a, sch.K, sch.V) for a in acts))
    console.print(table)
    console.print(f"latency {tl.latency_s:g} T (1F1B with uniform micro-batches: M + P - 1 = "
                  f"{sch.M + sch.P - 1}), bubble ratio {tl.bubble_ratio:.4f}, no deadlock")
    if plot is not None:
        console.print(f"wrote {plot}")


CPU_MEMORY_GIB = 1 / 32


def _parse_schemes(values: list[str]) -> list[tuple[int, int, int]]:
    out = []
    for v in values:
        parts = v.replace("<", "").replace(">", "").split(",")
        if len(parts) not in (2, 3) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise UserError(f"--schemes: {v!r} is not TP,PP or TP,PP,CP (positive integers)")
        out.append((int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 1))
    return out


@app.command("profile")
def profile_cmd(
    device: str = typer.Option("cpu", "--device", help="cpu | cuda: where the runtime measures"),
    model: str = typer.Option("tiny", "--model", help="runtime model config: tiny, llama2-7b, llama2-13b, llama2-32b"),
    schemes: list[str] | None = typer.Option(None, "--schemes", help="a scheme TP,PP or TP,PP,CP to measure; repeat for "
                                             "several (default: every power-of-two tp*pp <= --gpus the model allows, "
                                             "cp=1)"),
    gpus: int | None = typer.Option(None, "--gpus", help="ranks available (default: 4 on cpu, the CUDA device count on cuda)"),
    memory_gib: float | None = typer.Option(None, "--memory-gib", help="usable memory per device for MaxLen (default: 90% of "
                                            "the CUDA device's; on cpu 1/32 GiB, a stand-in that keeps the exact CPU "
                                            "attention's [T, T] scores small)"),
    out: Path | None = typer.Option(None, "--out", help="profile JSON to write (required unless --check)"),
    check: Path | None = typer.Option(None, "--check", help="replay this run folder's plans (or one plan) as whole "
                                      "iterations and compare with the end-to-end estimate"),
    profile_name: str | None = typer.Option(None, "--profile", help="--check: the profile whose estimates are compared"),
    dtype: str = typer.Option("fp32", "--dtype", help="compute dtype: fp32, bf16 (GPU), fp64"),
    clock: str | None = typer.Option(None, "--clock", help="wall: barrier-to-barrier wall time (default on cuda); cpu: "
                                     "per-action thread CPU time and the schedule's critical path (default on cpu: a "
                                     "shared or oversubscribed CPU's wall time measures the other processes)"),
    warmup: int = typer.Option(1, "--warmup", help="unrecorded runs before the measured ones"),
    repeats: int = typer.Option(3, "--repeats", help="measured runs per point; the median is kept"),
    launches: int = typer.Option(1, "--launches", help="separate runtime jobs per measurement, the median over them kept "
                                 "(a shared CPU runs one process ~20% faster or slower than another)"),
    json_out: bool = json_option("print the fit (or the --check rows) as JSON"),
) -> None:
    """Measure T(l,P) and MaxLen in the runtime on this machine and write a profile ("source": "measured"),
    or with --check replay plans and report estimated against measured whole iterations.

    Timing (--clock): wall time between barriers, or on CPU the critical path of the executed schedule over
    each action's thread CPU time; warm-up runs dropped, median of --repeats kept. A scheme's point is the
    1F1B latency of pp identical micro-batches (under CP: per-sequence shards) divided by 2*pp - 1 (the
    canonical T(m)), over single sequences and 4-document packings at fractions of MaxLen; a, b, c are
    fitted on all of them (the packings' own worst error is printed). LNK pull and push of each scheme's
    homogeneous layout over --gpus ranks give `network` (one node: inter-node set to the intra-node figure).
    --check replays whole iterations through the runtime's own step (pull overlapped with the forward, push
    with the last backward, optimizer step) and compares them with the end-to-end estimate, propagation and
    sync (exposed pull/push, waits, step) errors apart.
    """
    import json

    from rich.table import Table

    from hydraplan.app import measure

    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda (got {device!r})")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is visible")
    clock = clock or ("wall" if device == "cuda" else "cpu")
    if clock not in ("cpu", "wall") or (clock == "cpu" and device == "cuda"):
        raise UserError(f"--clock must be wall, or cpu on --device cpu (got {clock!r} on {device})")
    if warmup < 0 or repeats < 1 or launches < 1:
        raise UserError(f"--warmup must be >= 0, --repeats and --launches >= 1 (got {warmup}, {repeats} and {launches})")
    if check is not None:
        from hydraplan.store.profiles import load_profile

        if profile_name is None:
            raise UserError("--check needs --profile (the profile whose estimates are checked)")
        prof = load_profile(profile_name)
        with console.status("replaying whole iterations"), cliopts.Heartbeat(lambda: f"replaying {check} in the runtime"):
            rows = measure.check_plans(str(check), prof, model=model, device=device, clock=clock, dtype=dtype,
                                        warmup=warmup, repeats=repeats, launches=launches)
        summary = measure.check_summary(rows)
        if json_out:
            typer.echo(json.dumps({"profile": prof.name, **summary, "iterations": [measure.check_row_json(r) for r in rows]},
                                  indent=1))
            return
        table = Table("iteration", "strategy", "pipelines", "estimated s", "measured s", "error", "prop. error", "sync error",
                      title=f"{check}: end-to-end estimate ({prof.name}) vs measured whole iterations", title_justify="left")
        for r in rows:
            table.add_row(str(r.iteration), r.strategy, measure.describe_pipelines(r), f"{r.estimate_s:.4f}",
                          f"{r.measured_s:.4f}", f"{r.err:+.1%}", f"{r.propagation_err:+.1%}", f"{r.sync_err:+.1%}")
        console.print(table)
        console.print(f"whole-iteration error: mean {summary['mean_rel_err']:.1%}, worst {summary['worst_rel_err']:.1%} "
                      f"(iteration {summary['worst_iteration']}) over {len(rows)} iterations; mean share of the measured "
                      f"iteration: propagation {summary['mean_propagation_err']:+.1%}, sync {summary['mean_sync_err']:+.1%}")
        return
    if out is None:
        raise UserError("--out is required (the profile JSON to write), unless --check is given")
    cliopts.out_file(out)
    positive(gpus, "--gpus")
    from hydraplan.runtime.model import check_layout, get_config
    from hydraplan.store.fileio import write_model

    cfg = get_config(model)
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if device == "cuda" else 4
    if memory_gib is None:
        import torch

        memory_gib = 0.9 * torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else CPU_MEMORY_GIB
    if memory_gib <= 0:
        raise UserError(f"--memory-gib must be positive (got {memory_gib})")
    pow2 = [1 << i for i in range(gpus.bit_length())]
    todo = _parse_schemes(schemes) if schemes else sorted(
        ((t, p, 1) for t in pow2 for p in pow2 if t * p <= gpus and check_layout(cfg, t, p) is None),
        key=lambda k: (k[0] * k[1], k))
    for t, p, c in todo:
        if (why := check_layout(cfg, t, p)) is not None:
            raise UserError(f"--schemes: <{t},{p},{c}>: {why}")
        if t * p * c > gpus:
            raise UserError(f"--schemes: <{t},{p},{c}> needs {t * p * c} ranks but --gpus is {gpus}")
    where = ["measuring"]

    def step(what: str) -> None:
        where[0] = f"measuring {what} in the runtime"
        status.update(where[0])

    with console.status(where[0]) as status, cliopts.Heartbeat(lambda: where[0]):
        prof, fits = measure.measure_profile(out.stem, model, device, todo, memory_gib * 2**30, gpus_per_node=gpus,
                                             clock=clock, dtype=dtype, warmup=warmup, repeats=repeats,
                                             launches=launches, progress=step)
    write_model(out, prof)
    if json_out:
        typer.echo(json.dumps({"schemes": [{"scheme": s.label, "max_len": s.max_len, "util_len": s.util_len,
                                            **s.time.model_dump(), "r2": f.r2, "worst_rel_err": f.worst_rel_err,
                                            "packed_worst_rel_err": f.packed_worst_rel_err}
                                           for s, f in zip(prof.schemes, fits)],
                               "network": prof.network.model_dump(), "params": prof.model.params}, indent=1))
        return
    table = Table("scheme", "MaxLen", "UtilLen", "a", "b", "c", "R^2", "worst err", "packed worst err",
                  title=f"{prof.name}: measured on {prof.gpu.name}, {memory_gib:g} GiB per device", title_justify="left")
    for s, f in zip(prof.schemes, fits):
        packed = "-" if f.packed_worst_rel_err is None else f"{f.packed_worst_rel_err:.1%}"
        table.add_row(s.label, str(s.max_len), str(s.util_len), f"{s.time.a:.3g}", f"{s.time.b:.3g}", f"{s.time.c:.3g}",
                      f"{f.r2:.4f}", f"{f.worst_rel_err:.1%}", packed)
    (console if console.is_terminal else Console(width=120)).print(table)  # 9 columns: not 80 in logs
    net = prof.network
    console.print(f"LNK pull/push: {net.intra_node_GBps:.3g} GB/s per rank within the node (inter-node set equal: one "
                  f"node measured); model.params {prof.model.params:,}")
    console.print(f"wrote {out}")


@dataset_app.command("stats")
def dataset_stats(
    dataset: str = typer.Argument(..., help="a length file (.csv .parquet .txt .npy .json .jsonl .idx, .gz of the text "
                                  "forms), a Megatron prefix, or builtin:wikipedia / builtin:prolong"),
    context_len: int | None = context_len_option(),
    json_out: bool = json_option("print one JSON object (hydraplan.dataset-stats/v1)"),
    plot: Path | None = typer.Option(None, "--plot", help="also write the log2 histogram as a PNG"),
) -> None:
    """Length distribution: count, tokens, min/median/mean/p90/p99/max, long-tail shares, log2 histogram."""
    from hydraplan.core.lengthstats import summarize
    from hydraplan.store.datasets import load_dataset
    from hydraplan.store.fileio import model_json

    check_context_len(context_len)
    if plot is not None:
        cliopts.png_file(plot)
    ds = load_dataset(dataset, context_len)
    stats = summarize(ds.lengths, dataset=ds.name, context_len=ds.context_len, truncated=ds.truncated, empty=ds.empty)
    if plot is not None:
        from hydraplan.app.plots import plot_stats

        plot_stats(stats, plot)
    if json_out:
        typer.echo(model_json(stats))
        return
    _print_stats(stats)
    if plot is not None:
        console.print(f"wrote {plot}")


def _print_stats(stats) -> None:  # noqa: ANN001 (schema.DatasetStats, imported lazily)
    from rich.table import Table

    from hydraplan.core.lengthstats import format_tokens

    title = f"{stats.dataset}"
    if stats.context_len:
        title += f" (context {stats.context_len:,}: {stats.truncated:,} documents truncated)"
    if stats.empty:
        title += f" ({stats.empty:,} empty documents skipped)"
    console.print(title, markup=False, highlight=False)
    summary = Table("statistic", "value")
    for key in ("count", "tokens", "min", "median", "mean", "p90", "p99", "max"):
        value = getattr(stats, key)
        summary.add_row(key, f"{value:,}" if isinstance(value, int) else f"{value:,.1f}")
    for s in stats.share_above:
        summary.add_row(f"> {format_tokens(s.threshold)} tokens",
                        f"{s.tokens:.1%} of tokens, {s.docs:.2%} of documents")
    console.print(summary)
    hist = Table("length (lo, hi]", "documents", "% docs", "% tokens", "tokens share", title="log2 histogram",
                 title_justify="left")
    top = max(b.tokens for b in stats.histogram)
    for b in stats.histogram:
        hist.add_row(f"({format_tokens(b.lo)}, {format_tokens(b.hi)}]", f"{b.docs:,}", f"{b.docs / stats.count:.2%}",
                     f"{b.tokens / stats.tokens:.2%}", "█" * round(24 * b.tokens / top))
    console.print(hist)


@profiles_app.command("list")
def profiles_list(json_out: bool = json_option("print a JSON list instead of the table")) -> None:
    """The bundled profiles: the name --profile accepts, GPU, model, number of <TP,PP,CP> schemes, source."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from hydraplan.store.profiles import list_bundled

    entries = list_bundled()
    if json_out:
        typer.echo(json.dumps([asdict(e) for e in entries], indent=1))
        return
    table = Table("name", "GPU", "model", "schemes", "source", title="bundled profiles (use as --profile NAME)",
                  title_justify="left")
    for e in entries:
        table.add_row(e.name, e.gpu, e.model, str(e.schemes), e.source)
    console.print(table)


@profiles_app.command("show")
def profiles_show(
    name: str = typer.Argument(..., help="bundled profile name (see `profiles list`) or a profile JSON path"),
    gpus: int | None = typer.Option(None, "--gpus", help="cluster size: MaxLen recomputed for N GPUs, larger "
                                    "schemes hidden (default: the profile's reference_gpus)"),
    json_out: bool = json_option("print the profile itself (v1 JSON; for --gpus N, as seen by N GPUs)"),
) -> None:
    """Schemes of a profile: GPUs, MaxLen, UtilLen, T(4K) and steady-state tokens/s per GPU at 4K and 32K."""
    from rich.table import Table

    from hydraplan.core.cluster import for_gpus
    from hydraplan.core.cost import seq_time, tokens_per_gpu_s
    from hydraplan.store.fileio import model_json
    from hydraplan.store.profiles import load_profile

    positive(gpus, "--gpus")
    profile = load_profile(name)
    n = gpus if gpus is not None else profile.reference_gpus
    view = for_gpus(profile, n)
    if json_out:
        typer.echo(model_json(view if gpus is not None else profile))
        return
    table = Table("scheme", "GPUs", "MaxLen", "UtilLen", "T(4K) ms", "tok/s/GPU 4K", "tok/s/GPU 32K",
                  title=f"{profile.name}: {profile.gpu.name}, {profile.model.name}, MaxLen for {n} GPUs "
                  f"({profile.source})", title_justify="left")
    for s in sorted(view.schemes, key=lambda s: (s.gpus, s.key)):
        speed = [tokens_per_gpu_s(s, length) for length in (4096, 32768)]
        table.add_row(s.label, str(s.gpus), f"{s.max_len:,}", f"{s.util_len:,}", f"{seq_time(s, 4096) * 1e3:,.0f}",
                      *("OOM" if v is None else f"{v:,.0f}" for v in speed))
    console.print(table)


@profiles_app.command("generate")
def profiles_generate(
    out_dir: Path | None = typer.Option(None, "--out", "--out-dir", help="folder to write into (default: the bundled "
                                        "profiles/)"),
    json_out: bool = json_option("print the written paths as a JSON list"),
) -> None:
    """Rewrite the analytic profiles (H100, A800 x LLaMA-2 7B/13B/32B) from planner/hardware.py; deterministic."""
    import json

    from hydraplan.store.paths import PROFILES_DIR
    from hydraplan.store.profiles import write_analytic_profiles

    paths = write_analytic_profiles(cliopts.out_folder(out_dir or PROFILES_DIR))
    if json_out:
        typer.echo(json.dumps([str(p) for p in paths], indent=1))
        return
    for path in paths:
        console.print(f"wrote {path}")


cliopts.reflow_help(app, profiles_app, dataset_app)


def main() -> None:
    cliopts.run(app)
