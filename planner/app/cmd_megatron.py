"""`hydraplan megatron suggest`: the Megatron-LM settings under which hydraplan's hybrid-CP scheduler
(hydraplan.integrations.megatron) trains a dataset fastest, with the flags to paste."""

from __future__ import annotations

import typer

from hydraplan.app.cliopts import check_context_len, console, context_len_option, json_option, positive
from hydraplan.core.errors import UserError

megatron_app = typer.Typer(help="hydraplan inside Megatron-LM: the schedulers `hydraplan.integrations.megatron.install` "
                                "puts into Megatron, and the settings they run fastest with.", no_args_is_help=True)


def megatron_flags(tp: int, limit: int) -> str:
    """What Megatron-LM needs for hybrid CP with this TP (its argument checks: PP 1, per-token loss, the single
    data loader; sequence parallelism whenever TP > 1, as the profile's schemes assume)."""
    sp = " --sequence-parallel" if tp > 1 else ""
    return (f"--tensor-model-parallel-size {tp}{sp} --pipeline-model-parallel-size 1 --hybrid-context-parallel "
            f"--max-seqlen-per-dp-cp-rank {limit} --calculate-per-token-loss --dataloader-type single")


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
    json_out: bool = json_option('print {"tp", "max_seqlen_per_dp_cp_rank", "flags", "runs": [...]}'),
) -> None:
    """The TP and --max-seqlen-per-dp-cp-rank under which hydraplan's hybrid-CP scheduler is fastest on sampled
    global batches (each TP scored as Megatron's executor runs it, next to Megatron's own scheduler)."""
    import json

    from rich.table import Table

    from hydraplan.methods.megatron_seams import best_run, hybrid_cp_runs
    from hydraplan.store.datasets import load_dataset, sample_iterations
    from hydraplan.store.profiles import load_profile

    positive(gpus, "--gpus")
    positive(tokens_per_iter, "--tokens-per-iter")
    positive(iterations, "--iterations")
    check_context_len(context_len)
    if recompute not in ("none", "selective", "full"):
        raise UserError(f"--recompute must be none, selective or full (got {recompute!r})")
    prof = load_profile(profile)
    batches = [b.lengths for b in sample_iterations(load_dataset(dataset, context_len), tokens_per_iter, iterations, seed)]
    runs = hybrid_cp_runs(prof, batches, gpus, recompute)
    if not runs:
        raise UserError(f"--gpus {gpus}: no TP of profile {prof.name} leaves a power-of-two DPxCP group of 2 or more ranks")
    best = best_run(runs, "hydraplan-hcp")
    if best is None:
        raise UserError(f"no TP runs these batches on {gpus} GPUs of {prof.name}: "
                        + "; ".join(f"TP {r.tp}: {r.why_not}" for r in runs if r.method == "hydraplan-hcp"))
    mega = best_run(runs, "megatron-hcp")
    flags = megatron_flags(best.tp, best.max_seqlen_per_rank)
    if json_out:
        typer.echo(json.dumps({
            "tp": best.tp, "max_seqlen_per_dp_cp_rank": best.max_seqlen_per_rank, "flags": flags,
            "runs": [{"method": r.method, "tp": r.tp, "max_seqlen_per_dp_cp_rank": r.max_seqlen_per_rank,
                      "mean_iteration_s": r.mean_s if r.iteration_s else None, "why_not": r.why_not or None}
                     for r in runs]}, indent=1))
        return
    table = Table("TP", "max seqlen per rank", "hydraplan s/iter", "Megatron s/iter", title="hybrid CP, propagation")
    for tp in sorted({r.tp for r in runs}):
        row = {r.method: r for r in runs if r.tp == tp}
        cells = [f"{r.mean_s:.3f}" if r.iteration_s else "cannot run" for r in
                 (row["hydraplan-hcp"], row["megatron-hcp"])]
        table.add_row(str(tp), str(row["hydraplan-hcp"].max_seqlen_per_rank), *cells)
    console.print(table)
    for r in runs:
        if r.why_not:
            console.print(f"{r.method} at TP {r.tp}: {r.why_not}")
    versus = (f"; Megatron's scheduler at its best TP ({mega.tp}): {mega.mean_s:.3f} s, {mega.mean_s / best.mean_s:.2f}x"
              if mega else "; Megatron's scheduler runs out of memory at every TP")
    console.print(f"fastest: TP {best.tp}, {best.mean_s:.3f} s per global batch{versus}")
    console.print("in your training script, before pretrain(...):\n"
                  f"  from hydraplan.integrations.megatron import install; install({profile!r})")
    console.print(f"Megatron flags: {flags}")
