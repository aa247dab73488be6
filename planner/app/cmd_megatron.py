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


def packing_flags(scheme, capacity: int) -> str:
    """The layout and the packing scheduler's settings (Megatron-LM main reads `sequence_packing_scheduler` and
    `max_seqlen_per_dp_cp_rank` from its config in wrap_data_iterator)."""
    sp = " --sequence-parallel" if scheme.tp > 1 else ""
    return (f"--tensor-model-parallel-size {scheme.tp}{sp} --pipeline-model-parallel-size {scheme.pp} "
            f"--context-parallel-size {scheme.cp}; config: sequence_packing_scheduler='dp_balanced', "
            f"max_seqlen_per_dp_cp_rank={capacity // scheme.cp}")


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
    """For each of Megatron's seams, the settings under which hydraplan's scheduler is fastest on sampled global
    batches, next to Megatron's own scheduler, each scored as Megatron's executor runs it: hybrid CP, the TP and
    --max-seqlen-per-dp-cp-rank (propagation); sequence packing, the <tp,pp,cp> x dp layout (end to end)."""
    import json

    from rich.table import Table

    from hydraplan.core.cluster import Cluster
    from hydraplan.methods.megatron_seams import best_run, hybrid_cp_runs, packing_layouts, packing_run
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
    cluster = Cluster.of(prof, gpus)
    longest = context_len or int(data.lengths.max())
    packs = {(m, s.key): packing_run(m, cluster, batches, s) for s in packing_layouts(cluster, longest)
             for m in ("megatron-dp-balanced", "hydraplan-packing")}
    ours_p = min((r for (m, _), r in packs.items() if m == "hydraplan-packing"), key=lambda r: (r.mean_s, r.scheme.gpus),
                 default=None)
    theirs_p = min((r for (m, _), r in packs.items() if m == "megatron-dp-balanced"),
                   key=lambda r: (r.mean_s, r.scheme.gpus), default=None)
    runs = hybrid_cp_runs(prof, batches, gpus, recompute)
    if not runs:
        raise UserError(f"--gpus {gpus}: no TP of profile {prof.name} leaves a power-of-two DPxCP group of 2 or more ranks")
    best = best_run(runs, "hydraplan-hcp")
    if best is None:
        raise UserError(f"no TP runs these batches on {gpus} GPUs of {prof.name}: "
                        + "; ".join(f"TP {r.tp}: {r.why_not}" for r in runs if r.method == "hydraplan-hcp"))
    mega = best_run(runs, "megatron-hcp")
    flags = megatron_flags(best.tp, best.max_seqlen_per_rank)
    ours_p = ours_p if ours_p is not None and ours_p.mean_s < float("inf") else None  # None: no layout runs them
    theirs_p = theirs_p if theirs_p is not None and theirs_p.mean_s < float("inf") else None
    packing = None
    if ours_p is not None:
        packing = {"layout": ours_p.label, "max_seqlen_per_dp_cp_rank": ours_p.capacity // ours_p.scheme.cp,
                   "mean_iteration_s": ours_p.mean_s, "flags": packing_flags(ours_p.scheme, ours_p.capacity),
                   "dp_balanced_best_layout": theirs_p.label if theirs_p else None,
                   "dp_balanced_best_s": theirs_p.mean_s if theirs_p else None}
    if json_out:
        typer.echo(json.dumps({
            "tp": best.tp, "max_seqlen_per_dp_cp_rank": best.max_seqlen_per_rank, "flags": flags,
            "runs": [{"method": r.method, "tp": r.tp, "max_seqlen_per_dp_cp_rank": r.max_seqlen_per_rank,
                      "mean_iteration_s": r.mean_s if r.iteration_s else None, "why_not": r.why_not or None}
                     for r in runs], "packing": packing}, indent=1))
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
    if ours_p is None:
        console.print("sequence packing: no layout holds the context length")
        return
    versus = (f"; dp_balanced at its best layout ({theirs_p.label}): "
              f"{theirs_p.mean_s:.3f} s, {theirs_p.mean_s / ours_p.mean_s:.2f}x" if theirs_p else "")
    console.print(f"sequence packing (Megatron-LM main), end to end: fastest {ours_p.label}, {ours_p.mean_s:.3f} s per "
                  f"global batch{versus}")
    console.print(f"Megatron settings: {packing_flags(ours_p.scheme, ours_p.capacity)}")
