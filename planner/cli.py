"""The `hydraplan` command line: thin typer commands that call into the planner modules."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from planner.errors import UserError

app = typer.Typer(
    help="Plan heterogeneous, length-aware LLM training: propose strategies, pack iterations, compare.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
profiles_app = typer.Typer(help="Bundled GPU profiles (cost model per <TP,PP,CP> scheme).", no_args_is_help=True)
dataset_app = typer.Typer(help="Sequence-length datasets.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")
app.add_typer(dataset_app, name="dataset")

console = Console()
err_console = Console(stderr=True)


@app.command()
def schema(out_dir: Path = typer.Argument(..., help="folder to write <name>.schema.json into")) -> None:
    """Write the JSON Schemas of every file format (profile, strategies, plan, summary)."""
    import json

    from planner.fileio import atomic_write_text
    from planner.schema import SCHEMAS

    for name, model in SCHEMAS.items():
        path = out_dir / f"{name}.schema.json"
        atomic_write_text(path, json.dumps(model.model_json_schema(by_alias=True), indent=1) + "\n")
        console.print(f"wrote {path}")


@app.command()
def pack(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile JSON"),
    dataset: str = typer.Option(..., "--dataset", help="length file or builtin:wikipedia / builtin:prolong"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job"),
    tokens_per_iter: int = typer.Option(..., "--tokens-per-iter", help="token budget of one iteration's batch"),
    iterations: int = typer.Option(..., "--iterations", help="iterations to plan"),
    out: Path = typer.Option(..., "--out", help="run folder: iter_NNNNNN.json, strategies.json, summary.json"),
    strategies: Path | None = typer.Option(
        None, "--strategies", help="candidates (ranks optional); default: propose them and write OUT/strategies.json"),
    context_len: int | None = typer.Option(None, "--context-len", help="truncate sequences to this length"),
    seed: int = typer.Option(0, "--seed", help="sampling and solver seed: same seed, same plans"),
    workers: int | None = typer.Option(None, "--workers", help="solver processes (default: the core count)"),
    dispatch: str = typer.Option("greedy", "--dispatch", help="greedy (Alg. 1 + local search) or ilp (Eq. 3, exact)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run (same arguments required)"),
    seq1f1b: str | None = typer.Option(
        None, "--seq1f1b", help="K|auto: plan Seq1F1B for pp > 1 pipelines (K sub-sequences per micro-batch; raises their "
        "MaxLen; plans record splits and seq1f1b_estimate_s)"),
    cp_shard: bool = typer.Option(False, "--cp-shard", help="record adaptive WLB-LLM CP sharding (per-rank token ranges) "
                                  "for cp > 1 pipelines"),
) -> None:
    """Plan every iteration: dispatch to pipelines, pack micro-batches, keep the fastest candidate.

    Plans are written atomically in iteration order and do not depend on --workers.

    Without --resume an existing run in OUT is replaced; with it, planning continues after the last complete iteration.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from planner.iterate import PackOptions, run_pack
    from planner.schema import IterationSummary

    opts = PackOptions(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens_per_iter,
                       iterations=iterations, out=out, strategies=strategies, context_len=context_len, seed=seed,
                       workers=workers, dispatch=dispatch, resume=resume, seq1f1b=seq1f1b,
                       cp_shard=cp_shard)  # type: ignore[arg-type]
    bar = Progress(TextColumn("pack"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TextColumn("mean estimate {task.fields[mean]}"), TimeRemainingColumn(), console=err_console)

    class _Progress:
        """Iterations/s and the running mean estimate of this invocation."""

        def start(self, done: int, total: int) -> None:
            self.task = bar.add_task("pack", total=total, completed=done, rate="", mean="-")
            self.t0, self.n, self.sum = bar.get_time(), 0, 0.0

        def advance(self, it: IterationSummary) -> None:
            self.n += 1
            self.sum += it.estimate_s
            rate = self.n / max(bar.get_time() - self.t0, 1e-9)
            bar.update(self.task, advance=1, rate=f"{rate:.2f} it/s", mean=f"{self.sum / self.n:.3f} s")

    with bar:
        summary = run_pack(opts, _Progress())
    its = summary.iterations
    chosen = sorted({i.strategy for i in its})
    console.print(f"planned {len(its)} iterations into {out}: mean estimate "
                  f"{summary.mean_estimate_s:.4f} s, strategies used {', '.join(chosen)}")


@app.command()
def validate(
    path: Path = typer.Argument(..., help="a run folder or one iter_NNNNNN.json plan"),
    profile: str = typer.Option(..., "--profile", help="the profile the plans were made with"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable report"),
) -> None:
    """Check plans against every DESIGN.md constraint and recompute every estimate; exit 1 on a violation."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from planner.costmodel import load_profile
    from planner.validate import validate_path

    report = validate_path(path, load_profile(profile))
    if json_out:
        console.print_json(json.dumps({
            "ok": report.ok, "plans": report.plans, "pipelines": report.pipelines,
            "micro_batches": report.micro_batches, "violations": [asdict(v) for v in report.violations],
        }))
    elif report.ok:
        console.print(f"OK: {report.plans} plans, {report.pipelines} pipelines, "
                      f"{report.micro_batches} micro-batches satisfy every constraint")
    else:
        table = Table("file", "pipeline", "micro-batch", "kind", "problem")
        for v in report.violations:
            table.add_row(v.file, "" if v.pipeline is None else str(v.pipeline),
                          "" if v.micro_batch is None else str(v.micro_batch), v.kind, v.message)
        console.print(table)
        console.print(f"{len(report.violations)} violations in {report.plans} plans")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def compare(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile JSON"),
    dataset: str = typer.Option(..., "--dataset", help="length file or builtin:wikipedia / builtin:prolong"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs in the job"),
    tokens_per_iter: int = typer.Option(..., "--tokens-per-iter", help="token budget of one iteration's batch"),
    iterations: int = typer.Option(..., "--iterations", help="iterations to sample and compare"),
    out: Path = typer.Option(Path("plans/compare"), "--out", help="report folder: compare.json, report.html, *.png"),
    context_len: int | None = typer.Option(None, "--context-len", help="truncate sequences to this length"),
    seed: int = typer.Option(0, "--seed", help="sampling and solver seed"),
    methods: list[str] | None = typer.Option(
        None, "--methods", help="methods to run (repeat the option; default all): megatron hotspa wlb-llm flexsp "
        "homo-maxlen homo-pack hetero-static hydraplan"),
    json_out: bool = typer.Option(False, "--json", help="print compare.json instead of the table"),
) -> None:
    """Compare hydraplan with Megatron-LM, HotSPa, WLB-LLM, FlexSP and the Hydraulis ablations on the
    same sampled batches and the same cost model; write compare.json, PNG plots and report.html.

    Static baselines get their best scheme, tuned on the compared batches themselves.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from planner.compare import ALL_METHODS, CompareOptions, run_compare
    from planner.fileio import model_json
    from planner.report import TABLE_HEADER, table_rows, wlb_line, write_report

    chosen = tuple(m for part in (methods or list(ALL_METHODS)) for m in part.replace(",", " ").split())
    opts = CompareOptions(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens_per_iter,
                          iterations=iterations, seed=seed, context_len=context_len, methods=chosen)
    bar = Progress(TextColumn("compare"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[what]}"),
                   TimeElapsedColumn(), console=err_console)

    class _Progress:
        def start(self, total: int) -> None:
            self.task = bar.add_task("compare", total=total, what="")

        def advance(self, what: str) -> None:
            bar.update(self.task, advance=1, what=what)

    with bar:
        outcome = run_compare(opts, _Progress())
        paths = write_report(outcome, out)
    if json_out:
        console.print_json(model_json(outcome.result))
        return
    r = outcome.result
    table = Table(*TABLE_HEADER, title=f"{r.profile} {r.dataset} {r.gpus} GPUs {r.tokens_per_iter} tokens/iter "
                  f"context {r.context_len}, {r.iterations} iterations")
    for row in table_rows(r):
        table.add_row(*row)
    console.print(table)
    line = wlb_line(r)
    if line:
        console.print(line)
    console.print(f"wrote {paths['report.html']} and {paths['compare.json']}")


@app.command()
def pipeline(
    schedule: str = typer.Option(..., "--schedule", help="1f1b | interleaved | seq1f1b | seq1f1b-interleaved"),
    stages: int = typer.Option(..., "--stages", help="pipeline stages P (devices)"),
    micro_batches: int = typer.Option(..., "--micro-batches", help="micro-batches M"),
    splits: int = typer.Option(4, "--splits", help="Seq1F1B sub-sequences per micro-batch K (seq1f1b kinds)"),
    chunks: int = typer.Option(2, "--chunks", help="model chunks per device V (interleaved kinds)"),
    json_out: bool = typer.Option(False, "--json", help='print {"stages": [[{"op","mb","split","chunk"}, ...], ...], ...}'),
    plot: Path | None = typer.Option(None, "--plot", help="also draw the timeline (Gantt) as a PNG"),
) -> None:
    """Per-stage action lists of a pipeline schedule, checked for deadlock by executing them, with the
    bubble ratio and peak live activations for uniform micro-batches (T = 1 per micro-batch and stage,
    forward 1/3, backward 2/3). Actions read F3 (forward of micro-batch 3), F3.1 (its split 1), F3c1 (chunk 1).
    """
    import json

    from rich.table import Table

    from planner.pipeline import action_label, forwards_before_first_backward, make_schedule, plot_timeline, unit_timeline

    sch = make_schedule(schedule, stages, micro_batches, splits, chunks)
    tl = unit_timeline(sch)
    if plot is not None:
        plot_timeline(tl, plot, unit="T")
    live_mb = [round(b, 4) for b in tl.peak_live_bytes or []]
    if json_out:
        out = sch.to_json() | {"schedule": sch.name, "P": sch.P, "M": sch.M, "K": sch.K, "V": sch.V,
                               "latency": tl.latency_s, "bubble_ratio": tl.bubble_ratio,
                               "peak_live": tl.peak_live, "peak_live_micro_batches": live_mb}
        console.print_json(json.dumps(out))
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


@dataset_app.command("stats")
def dataset_stats(
    dataset: str = typer.Argument(..., help="a length file (.csv .parquet .txt .npy .json .jsonl .idx, .gz of the text "
                                  "forms), a Megatron prefix, or builtin:wikipedia / builtin:prolong"),
    context_len: int | None = typer.Option(None, "--context-len", help="truncate documents to this many tokens first"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object (hydraplan.dataset-stats/v1)"),
    plot: Path | None = typer.Option(None, "--plot", help="also write the log2 histogram as a PNG"),
) -> None:
    """Length distribution: count, tokens, min/median/mean/p90/p99/max, long-tail shares, log2 histogram."""
    from planner.datasets import load_dataset
    from planner.fileio import model_json
    from planner.lengthstats import summarize

    ds = load_dataset(dataset, context_len)
    stats = summarize(ds.lengths, dataset=ds.name, context_len=ds.context_len, truncated=ds.truncated)
    if plot is not None:
        from planner.lengthplot import plot_stats

        plot_stats(stats, plot)
    if json_out:
        typer.echo(model_json(stats))
        return
    _print_stats(stats)
    if plot is not None:
        console.print(f"wrote {plot}")


def _print_stats(stats) -> None:  # noqa: ANN001 (schema.DatasetStats, imported lazily)
    from rich.table import Table

    from planner.lengthstats import format_tokens

    title = f"{stats.dataset}"
    if stats.context_len:
        title += f" (context {stats.context_len:,}: {stats.truncated:,} documents truncated)"
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
def profiles_list(json_out: bool = typer.Option(False, "--json", help="print a JSON list instead of the table")) -> None:
    """The bundled profiles: the name --profile accepts, GPU, model, number of <TP,PP,CP> schemes, source."""
    import json
    from dataclasses import asdict

    from rich.table import Table

    from planner.costmodel import list_bundled

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
    json_out: bool = typer.Option(False, "--json", help="print the profile itself (v1 JSON; for --gpus N, as seen by N GPUs)"),
) -> None:
    """Schemes of a profile: GPUs, MaxLen, UtilLen, T(4K) and steady-state tokens/s per GPU at 4K and 32K."""
    from rich.table import Table

    from planner.costmodel import for_gpus, load_profile, seq_time, tokens_per_gpu_s
    from planner.fileio import model_json

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
    out_dir: Path | None = typer.Option(None, "--out-dir", help="where to write (default: the bundled profiles/)"),
) -> None:
    """Rewrite the analytic profiles (H100, A800 x LLaMA-2 7B/13B/32B) from planner/hardware.py; deterministic."""
    from planner.costmodel import write_analytic_profiles
    from planner.paths import PROFILES_DIR

    for path in write_analytic_profiles(out_dir or PROFILES_DIR):
        console.print(f"wrote {path}")


def main() -> None:
    try:
        app()
    except UserError as e:
        err_console.print(f"hydraplan: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
