"""The commands that show or write files and models: schema, pipeline, dataset stats, profiles."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from hydraplan.app import cliopts
from hydraplan.app.cliopts import (
    check_context_len,
    console,
    context_len_option,
    json_option,
    positive,
)
from hydraplan.core.errors import UserError


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
                  title=f"{profile.name}: {profile.gpu.name}, {profile.model.name}"
                  + (f", {profile.dtype}" if profile.dtype else "") + f", MaxLen for {n} GPUs ({profile.source})",
                  title_justify="left")
    for s in sorted(view.schemes, key=lambda s: (s.gpus, s.key)):
        speed = [tokens_per_gpu_s(s, length) for length in (4096, 32768)]
        table.add_row(s.label, str(s.gpus), f"{s.max_len:,}", f"{s.util_len:,}", f"{seq_time(s, 4096) * 1e3:,.0f}",
                      *("OOM" if v is None else f"{v:,.0f}" for v in speed))
    console.print(table)


def profiles_memory(
    name: str = typer.Argument(..., help="bundled profile name or a profile JSON path"),
    scheme: str = typer.Argument(..., help="the scheme, TP,PP,CP or TP,PP,CP,MODE (e.g. 1,1,1 or 8,1,2,full)"),
    gpus: int | None = typer.Option(None, "--gpus", help="cluster size N (default: the profile's reference_gpus)"),
    tokens: int | None = typer.Option(None, "--tokens", help="tokens of the rank's largest micro-batch (default: "
                                      "the scheme's MaxLen for N GPUs)"),
    stage: int = typer.Option(0, "--stage", help="pipeline stage (measured profiles; analytic ones model the worst)"),
    value_bytes: int = typer.Option(2, "--value-bytes", help="bytes per value of the compute dtype LNK moves, for "
                                    "profiles measured before LNK's buffers were counted (2: bf16, 4: fp32)"),
    json_out: bool = json_option("print the terms as JSON"),
) -> None:
    """A rank's memory under the profile's model, term by term (hydraplan.core.memory.rank_memory): optimizer
    states, weights and gradients, LNK's in-flight pull and push buffers, communicator buffers, activations and
    the K/V that CP and Seq1F1B keep, each with its source; the total against the usable capacity."""
    import json

    from rich.table import Table

    from hydraplan.core.cluster import for_gpus
    from hydraplan.core.memory import rank_memory
    from hydraplan.core.schema import scheme_label
    from hydraplan.store.profiles import load_profile

    positive(gpus, "--gpus")
    positive(tokens, "--tokens")
    profile = load_profile(name)
    key = cliopts.scheme_key(scheme, "SCHEME")
    n = gpus if gpus is not None else profile.reference_gpus
    found = next((s for s in profile.schemes if s.key == key), None)
    if found is None:
        raise UserError(f"SCHEME: {scheme_label(key)} is not a scheme of profile {profile.name}")
    view = next((s for s in for_gpus(profile, n).schemes if s.key == key), None) if n >= found.gpus else None
    length = tokens if tokens is not None else (view.max_len if view is not None else found.max_len)
    mem = rank_memory(profile, found, stage, n, length, value_bytes)
    if mem is None:
        raise UserError(f"{name}: scheme {found.label}, stage {stage}: the profile has no memory model for it")
    capacity = profile.memory.capacity_bytes if profile.memory is not None else profile.gpu.memory_gib * 2**30
    if json_out:
        typer.echo(json.dumps({"profile": profile.name, "scheme": found.label, "gpus": n, "stage": stage,
                               "tokens": length, "terms": [{"name": t.name, "bytes": t.bytes, "source": t.source}
                                                           for t in mem.terms],
                               "total_bytes": mem.total, "capacity_bytes": capacity}, indent=1))
        return
    table = Table("term", "bytes", "share", "source", title=f"{profile.name} {found.label} stage {stage} on {n} GPUs, "
                  f"largest micro-batch {length:,} tokens", title_justify="left")
    for t in mem.terms:
        table.add_row(t.name, _bytes(t.bytes), f"{t.bytes / mem.total:.1%}", t.source)
    table.add_row("total", _bytes(mem.total), "100%", f"usable capacity {_bytes(capacity)} "
                  f"({profile.gpu.memory_gib:g} GiB {profile.gpu.name})")
    (console if console.is_terminal else Console(width=160)).print(table)


def profiles_time(
    name: str = typer.Argument(..., help="bundled profile name or a profile JSON path"),
    scheme: str = typer.Argument(..., help="the scheme, TP,PP,CP or TP,PP,CP,MODE (e.g. 1,1,4 or 8,1,2,full)"),
    tokens: int = typer.Option(4096, "--tokens", help="a micro-batch of one sequence this long: each term's seconds"),
    json_out: bool = json_option("print the terms as JSON"),
) -> None:
    """A scheme's T(l) = a*l^2 + b*l + c term by term (analytic profiles: hydraplan.core.stagetime): each physical
    term's share of a, b and c, what it adds to a micro-batch of --tokens, and its source; c is the per-micro-batch
    constant."""
    import json

    from rich.table import Table

    from hydraplan.core.schema import scheme_label
    from hydraplan.store.profiles import load_profile

    positive(tokens, "--tokens")
    profile = load_profile(name)
    key = cliopts.scheme_key(scheme, "SCHEME")
    found = next((s for s in profile.schemes if s.key == key), None)
    if found is None:
        raise UserError(f"SCHEME: {scheme_label(key)} is not a scheme of profile {profile.name}")
    t = found.time
    parts = {"a": t.a_terms, "b": t.b_terms, "c": t.c_terms}
    if not any(parts.values()):
        parts = {"a": {"a": t.a}, "b": {"b": t.b}, "c": {"c": t.c}}  # a measured or hand-written profile: no terms
    notes = profile.notes or {}
    power = {"a": tokens**2, "b": tokens, "c": 1}
    rows = [(part, term, v, v * power[part], notes.get(f"time.{term}", "")) for part, terms in parts.items()
            for term, v in (terms or {}).items()]
    total = (t.a * tokens + t.b) * tokens + t.c
    if json_out:
        typer.echo(json.dumps({"profile": profile.name, "scheme": found.label, "a": t.a, "b": t.b, "c": t.c,
                               "fit_rel_err": t.fit_rel_err, "tokens": tokens, "seconds": total,
                               "terms": [{"part": p, "name": n, "value": v, "seconds": sec, "source": src}
                                         for p, n, v, sec, src in rows]}, indent=1))
        return
    table = Table("part", "term", "value", f"s at {tokens:,}", "share", "source",
                  title=f"{profile.name} {found.label}: T({tokens:,}) = {total * 1e3:,.2f} ms; a = {t.a:.4g}, b = "
                  f"{t.b:.4g}, c = {t.c * 1e3:.3g} ms" + (f", fit error {t.fit_rel_err:.1%}" if t.fit_rel_err else ""),
                  title_justify="left")
    for part, term, v, sec, src in rows:
        table.add_row(part, term, f"{v:.4g}", f"{sec * 1e3:,.3f} ms", f"{sec / total:.1%}", src)
    (console if console.is_terminal else Console(width=160)).print(table)


def _bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def profiles_generate(
    out: Path | None = typer.Option(None, "--out", "--out-dir", help="the folder to write the bundled profiles into "
                                    "(default: profiles/); with --hf-config, the profile file to write"),
    hf_config: Path | None = typer.Option(None, "--hf-config", help="a Hugging Face config.json (LlamaForCausalLM, "
                                          "MistralForCausalLM, Qwen2ForCausalLM): write its analytic profile"),
    gpu: str | None = typer.Option(None, "--gpu", help="with --hf-config: h100 | h200 | a100 | a800 | h100-500w"),
    name: str | None = typer.Option(None, "--name", help="with --hf-config: the profile's name (default GPU-STEM of "
                                    "the config file, -fp8 for --dtype fp8)"),
    dtype: str = typer.Option("bf16", "--dtype", help="with --hf-config: the GEMMs' dtype, bf16 or fp8 (Transformer "
                              "Engine's FP8 GEMMs, on a GPU with FP8 tensor cores)"),
    framework: str = typer.Option("hydraplan", "--framework", help="with --hf-config: the training framework's "
                                  "constants: hydraplan (the runtime), megatron (Megatron-Core with Transformer Engine), "
                                  "megatron-bridge, torchtitan"),
    json_out: bool = json_option("print the written paths as a JSON list"),
) -> None:
    """Rewrite the bundled analytic profiles (H100 bf16 and fp8, A800 x LLaMA-2 7B/13B/32B; H100, H200 x
    data/models/*.json, bf16 and fp8) from planner/core/hardware.py, or with --hf-config write one model's analytic
    profile on one GPU; deterministic."""
    import json

    from hydraplan.store.fileio import write_model
    from hydraplan.store.paths import PROFILES_DIR
    from hydraplan.store.profiles import hf_profile, write_analytic_profiles

    if hf_config is None:
        if gpu is not None or name is not None or dtype != "bf16" or framework != "hydraplan":
            raise UserError("--gpu, --name, --dtype and --framework go with --hf-config (the bundled set holds both "
                            "dtypes)")
        paths = write_analytic_profiles(cliopts.out_folder(out or PROFILES_DIR))
    else:
        if gpu is None or out is None:
            raise UserError("--hf-config needs --gpu (h100, h200, a100, a800, h100-500w) and --out FILE")
        if out.is_dir():
            raise UserError(f"--out {out}: is a folder; with --hf-config give the profile file to write")
        profile = hf_profile(hf_config, gpu, name, dtype, framework)
        cliopts.out_folder(out.parent)
        write_model(out, profile)
        paths = [out]
    if json_out:
        typer.echo(json.dumps([str(p) for p in paths], indent=1))
        return
    for path in paths:
        console.print(f"wrote {path}")


# The simulator is pure Python, tens of thousands of actions per second: the limit keeps the answer within
# seconds instead of a silent minute for millions of actions.
MAX_PIPELINE_ACTIONS = 100_000
