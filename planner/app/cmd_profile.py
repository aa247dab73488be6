"""`hydraplan profile`: measure a profile in the runtime on this machine, or check plans against one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hydraplan.app import cliopts
from hydraplan.app.cliopts import (
    console,
    json_option,
    positive,
)
from hydraplan.core.errors import UserError

if TYPE_CHECKING:
    from hydraplan.app.measure import Runs


def profile_cmd(
    device: str = typer.Option("cpu", "--device", help="cpu | cuda: where the runtime measures"),
    model: str = typer.Option("tiny", "--model", help="runtime model config: tiny, llama2-7b, llama2-13b, llama2-32b"),
    hf_config: Path | None = typer.Option(None, "--hf-config", help="measure the model of a Hugging Face config.json "
                                          "(Llama, Mistral, Qwen2) instead of --model"),
    schemes: list[str] | None = typer.Option(None, "--schemes", help="a scheme TP,PP, TP,PP,CP or TP,PP,CP,MODE to "
                                             "measure; repeat for several (default: every power-of-two tp*pp <= --gpus "
                                             "the model allows, cp=1)"),
    recompute: list[str] | None = typer.Option(None, "--recompute", help="activation recomputation none | selective | "
                                               "full measured for each scheme given without a mode; repeat for several "
                                               "(default: all three)"),
    gpus: int | None = typer.Option(None, "--gpus", help="ranks available (default: 4 on cpu, the CUDA device count on cuda)"),
    memory_gib: float | None = typer.Option(None, "--memory-gib", help="usable memory per device for MaxLen (default: 90% of "
                                            "the CUDA device's; on cpu 1/32 GiB, a stand-in that keeps the exact CPU "
                                            "attention's [T, T] scores small)"),
    out: Path | None = typer.Option(None, "--out", help="profile JSON to write (required unless --check)"),
    check: Path | None = typer.Option(None, "--check", help="replay this run folder's plans (or one plan) as whole "
                                      "iterations and compare with the end-to-end estimate"),
    profile_name: str | None = typer.Option(None, "--profile", help="--check: the profile whose estimates are compared"),
    dtype: str | None = typer.Option(None, "--dtype", help="compute dtype: bf16, fp32, fp64 (default bf16 on cuda, "
                                     "fp32 on cpu)"),
    clock: str | None = typer.Option(None, "--clock", help="wall: barrier-to-barrier wall time (default on cuda); cpu: "
                                     "per-action thread CPU time and the schedule's critical path (default on cpu: a "
                                     "shared or oversubscribed CPU's wall time measures the other processes)"),
    warmup: int = typer.Option(1, "--warmup", help="unrecorded runs before the measured ones"),
    repeats: int = typer.Option(3, "--repeats", help="measured runs per point; the median is kept"),
    launches: int = typer.Option(1, "--launches", help="separate runtime jobs per measurement, the median over them kept "
                                 "(on a shared CPU one process runs noticeably faster or slower than another)"),
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
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda (got {device!r})")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is visible")
    clock = clock or ("wall" if device == "cuda" else "cpu")
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype == "fp8":
        raise UserError("--dtype fp8: FP8 GEMMs need Transformer Engine on a CUDA GPU, which the runtime does not drive; "
                        "`hydraplan profiles generate --dtype fp8` writes an analytic fp8 profile")
    if dtype not in ("bf16", "fp32", "fp64"):
        raise UserError(f"--dtype must be bf16, fp32 or fp64 (got {dtype!r})")
    if clock not in ("cpu", "wall") or (clock == "cpu" and device == "cuda"):
        raise UserError(f"--clock must be wall, or cpu on --device cpu (got {clock!r} on {device})")
    if warmup < 0 or repeats < 1 or launches < 1:
        raise UserError(f"--warmup must be >= 0, --repeats and --launches >= 1 (got {warmup}, {repeats} and {launches})")
    from hydraplan.app.measure import Runs

    if hf_config is not None:
        if model != "tiny":
            raise UserError("--model and --hf-config: give one")
        if hf_config.suffix != ".json":
            raise UserError(f"--hf-config {hf_config}: expected a config.json file")
        model = str(hf_config.resolve())  # the runtime's --model takes a config.json path too
    runs = Runs(model=model, device=device, clock=clock, dtype=dtype, warmup=warmup, repeats=repeats, launches=launches)
    if check is not None:
        if profile_name is None:
            raise UserError("--check needs --profile (the profile whose estimates are checked)")
        _check(check, profile_name, json_out, runs)
        return
    if out is None:
        raise UserError("--out is required (the profile JSON to write), unless --check is given")
    cliopts.out_file(out)
    positive(gpus, "--gpus")
    _measure(out, schemes, recompute, gpus, memory_gib, json_out, runs)


def _check(check: Path, profile_name: str, json_out: bool, runs: Runs) -> None:
    """--check: replay the plans as whole iterations, estimated against measured."""
    import json

    from rich.table import Table

    from hydraplan.app import measure
    from hydraplan.store.profiles import load_profile

    prof = load_profile(profile_name)
    with console.status("replaying whole iterations"), cliopts.Heartbeat(lambda: f"replaying {check} in the runtime"):
        rows = measure.check_plans(str(check), prof, runs)
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
    cliopts.print_table(table)
    over = cliopts.plural(len(rows), "iteration")
    console.print(f"whole-iteration error: mean {summary['mean_rel_err']:.1%}, worst {summary['worst_rel_err']:.1%} "
                  f"(iteration {summary['worst_iteration']}) over {over}; mean share of the measured "
                  f"iteration: propagation {summary['mean_propagation_err']:+.1%}, sync {summary['mean_sync_err']:+.1%}")


def _schemes_to_measure(schemes: list[str] | None, modes: list[str] | None, model: str,
                        gpus: int) -> list[tuple[int, int, int, str]]:
    """The schemes to measure, each scheme given without a mode once per mode of --recompute."""
    from hydraplan.core.schema import RECOMPUTE_MODES
    from hydraplan.runtime.hf import model_config
    from hydraplan.runtime.model import check_layout

    bad = [m for m in modes or () if m not in RECOMPUTE_MODES]
    if bad:
        raise UserError(f"--recompute: {bad[0]!r} is not one of {', '.join(RECOMPUTE_MODES)}")
    cfg = model_config(model)
    pow2 = [1 << i for i in range(gpus.bit_length())]
    layouts = _parse_schemes(schemes) if schemes else sorted(
        ((t, p, 1, None) for t in pow2 for p in pow2 if t * p <= gpus and check_layout(cfg, t, p) is None),
        key=lambda k: (k[0] * k[1], k[:3]))
    todo = [(t, p, c, mode) for t, p, c, m in layouts for mode in ([m] if m else modes or RECOMPUTE_MODES)]
    for t, p, c, _ in todo:
        if (why := check_layout(cfg, t, p)) is not None:
            raise UserError(f"--schemes: <{t},{p},{c}>: {why}")
        if t * p * c > gpus:
            raise UserError(f"--schemes: <{t},{p},{c}> needs {t * p * c} ranks but --gpus is {gpus}")
    return list(dict.fromkeys(todo))


def _measure(out: Path, schemes: list[str] | None, modes: list[str] | None, gpus: int | None, memory_gib: float | None,
             json_out: bool, runs: Runs) -> None:
    """Measure every scheme in the runtime and write the profile."""
    import json

    from rich.table import Table

    from hydraplan.app import measure
    from hydraplan.store.fileio import write_model

    device = runs.device
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if device == "cuda" else 4
    if memory_gib is None:
        import torch

        memory_gib = 0.9 * torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else CPU_MEMORY_GIB
    if memory_gib <= 0:
        raise UserError(f"--memory-gib must be positive (got {memory_gib})")
    todo = _schemes_to_measure(schemes, modes, runs.model, gpus)
    where = ["measuring"]

    def step(what: str) -> None:
        where[0] = f"measuring {what} in the runtime"
        status.update(where[0])

    with console.status(where[0]) as status, cliopts.Heartbeat(lambda: where[0]):
        prof, fits = measure.measure_profile(out.stem, runs, todo, memory_gib * 2**30, gpus_per_node=gpus, progress=step)
    write_model(out, prof)
    net = prof.network
    assert net is not None  # measure_profile measures the network
    if json_out:
        typer.echo(json.dumps({"schemes": [{"scheme": s.label, "max_len": s.max_len, "util_len": s.util_len,
                                            **s.time.model_dump(), "r2": f.r2, "worst_rel_err": f.worst_rel_err,
                                            "packed_worst_rel_err": f.packed_worst_rel_err}
                                           for s, f in zip(prof.schemes, fits)],
                               "network": net.model_dump(), "params": prof.model.params, "dtype": prof.dtype},
                              indent=1))
        return
    table = Table("scheme", "MaxLen", "UtilLen", "a", "b", "c", "R^2", "worst err", "packed worst err",
                  title=f"{prof.name}: measured on {prof.gpu.name} in {prof.dtype}, {memory_gib:g} GiB per device",
                  title_justify="left")
    for s, f in zip(prof.schemes, fits):
        packed = "-" if f.packed_worst_rel_err is None else f"{f.packed_worst_rel_err:.1%}"
        table.add_row(s.label, str(s.max_len), str(s.util_len), f"{s.time.a:.3g}", f"{s.time.b:.3g}", f"{s.time.c:.3g}",
                      f"{f.r2:.4f}", f"{f.worst_rel_err:.1%}", packed)
    cliopts.print_table(table, piped_width=120)  # 9 columns: not 80 in logs
    console.print(f"LNK pull/push: {net.intra_node_GBps:.3g} GB/s per rank within the node (inter-node set equal: one "
                  f"node measured); model.params {prof.model.params:,}")
    console.print(f"wrote {out}")


CPU_MEMORY_GIB = 1 / 32


def _parse_schemes(values: list[str]) -> list[tuple[int, int, int, str | None]]:
    """(tp, pp, cp, mode or None: every mode of --recompute) of each TP,PP[,CP[,MODE]]."""
    return [cliopts.scheme_key(v, "--schemes", mode=None) for v in values]
