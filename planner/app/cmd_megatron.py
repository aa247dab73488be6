"""`hydraplan megatron suggest`: for each of Megatron-LM's seams, the settings under which hydraplan's scheduler
(hydraplan.integrations.megatron) trains a dataset fastest, which seam to use, and the flags to paste."""

from __future__ import annotations

import typer

from hydraplan.app.cliopts import check_context_len, console, context_len_option, json_option, positive, print_table
from hydraplan.core.errors import UserError

megatron_app = typer.Typer(help="hydraplan inside Megatron-LM: the schedulers `hydraplan.integrations.megatron.install` "
                                "puts into Megatron, and the settings they run fastest with.", no_args_is_help=True)


@megatron_app.command("suggest")
def suggest(
    profile: str = typer.Option(..., "--profile", help="bundled profile name or profile file"),
    dataset: str = typer.Option(..., "--dataset", help="builtin:NAME or a lengths file"),
    gpus: int = typer.Option(..., "--gpus", help="GPUs of the job"),
    tokens_per_iter: int = typer.Option(..., "--tokens-per-iter", help="tokens per global batch"),
    context_len: int | None = context_len_option(),
    iterations: int = typer.Option(8, "--iterations", help="global batches sampled to choose on"),
    seed: int = typer.Option(0, "--seed", help="sampling seed"),
    recompute: str = typer.Option("none", "--recompute", help="Megatron's --recompute-granularity: none | selective | full"),
    json_out: bool = json_option('print {"objective", "use", "install", "seams": {...}, "hybrid_cp_runs": [...], '
                                 '"dynamic_cp_runs": [...]}'),
) -> None:
    """For each of Megatron's seams (hybrid CP, sequence packing, dynamic CP), the setting under which hydraplan's
    scheduler runs sampled global batches fastest, next to Megatron's own scheduler at its fastest setting, every
    row scored on propagation as Megatron's executor runs it; which seam to use, and its complete flags."""
    import json

    from rich.table import Table

    from hydraplan.core.cluster import Cluster
    from hydraplan.methods.megatron_suggest import OBJECTIVE, TITLES, VERSIONS
    from hydraplan.methods.megatron_suggest import suggest as run_suggest
    from hydraplan.store.datasets import load_dataset, sample_iterations
    from hydraplan.store.profiles import load_profile

    positive(gpus, "--gpus")
    positive(tokens_per_iter, "--tokens-per-iter")
    positive(iterations, "--iterations")
    check_context_len(context_len)
    if recompute not in ("none", "selective", "full"):
        raise UserError(f"--recompute must be none, selective or full (got {recompute!r})")
    prof = load_profile(profile)
    data = load_dataset(dataset, context_len)
    batches = [b.lengths for b in sample_iterations(data, tokens_per_iter, iterations, seed)]
    longest = context_len or int(data.lengths.max())
    found = run_suggest(Cluster.of(prof, gpus), batches, longest, tokens_per_iter, recompute)
    if not found.picks:
        raise UserError(f"--gpus {gpus}: no seam runs these batches on {gpus} GPUs of {prof.name}: "
                        + "; ".join(f"hybrid CP TP {r.tp}: {r.why_not}" for r in found.hybrid
                                    if r.method == "hydraplan-hcp" and r.why_not))
    install = f"from hydraplan.integrations.megatron import install; install({profile!r})"
    if json_out:
        typer.echo(json.dumps({
            "objective": OBJECTIVE, "use": found.use, "install": install,
            "seams": {s: {"versions": VERSIONS[s], "setting": p.setting, "mean_iteration_s": p.seconds, "tp": p.tp,
                          "max_seqlen_per_dp_cp_rank": p.max_seqlen_per_dp_cp_rank, "flags": p.flags,
                          "megatron_setting": p.megatron_setting, "megatron_mean_iteration_s": p.megatron_s}
                      for s, p in found.picks.items()},
            "hybrid_cp_runs": [{"method": r.method, "tp": r.tp, "max_seqlen_per_dp_cp_rank": r.max_seqlen_per_rank,
                                "mean_iteration_s": r.mean_s if r.iteration_s else None, "why_not": r.why_not or None}
                               for r in found.hybrid],
            "dynamic_cp_runs": [{"method": r.method, "tp": r.tp, "max_seqlen_per_dp_cp_rank": r.max_seqlen_per_rank,
                                 "mean_iteration_s": r.mean_s if r.iteration_s else None, "invalid": r.invalid,
                                 "why_not": r.why_not or None}
                                for r in found.dynamic]}, indent=1))
        return
    table = Table("seam", "hydraplan", "s/iter", "Megatron's scheduler", "s/iter", "speedup",
                  title=f"seconds per global batch, {OBJECTIVE} (as Megatron's executor runs each schedule)")
    for s, p in found.picks.items():
        table.add_row(TITLES[s], p.setting, f"{p.seconds:.3f}", p.megatron_setting or "runs no setting",
                      f"{p.megatron_s:.3f}" if p.megatron_s else "", f"{p.speedup:.2f}x" if p.speedup else "")
    print_table(table)
    for r in found.hybrid:
        if r.why_not:
            console.print(f"hybrid CP, {r.method} at TP {r.tp}: {r.why_not}", soft_wrap=True, markup=False)
    use = found.picks[found.use] if found.use else None
    if use is not None:
        console.print(f"use {TITLES[use.seam]}, {use.setting}: {use.seconds:.3f} s per global batch "
                      f"[{VERSIONS[use.seam]}]", soft_wrap=True, markup=False)
    typer.echo(f"in your training script, before pretrain(...):\n  {install}")
    for s, p in found.picks.items():  # one line each, never wrapped: pasted into a command line as printed
        typer.echo(f"{TITLES[s]} flags [{VERSIONS[s]}]:\n  {p.flags}")
