"""`hydraplan doctor`: one command that proves an installation on a new cluster (runtime/doctor.py does the work
under torchrun on this node's devices; this prints its table and exits 1 on any failure)."""

from __future__ import annotations

import typer
from rich.table import Table

from hydraplan.app.cliopts import console, json_option, positive
from hydraplan.core.errors import UserError

CHECKS = ("attention", "collectives", "replay", "memory", "activations")
MODULE = "hydraplan.runtime.doctor"


def doctor(
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda (auto: cuda when a GPU is visible)"),
    ranks: int | None = typer.Option(None, "--ranks", help="ranks to run (default: 4 on cpu, every GPU of the node "
                                     "on cuda)"),
    checks: list[str] | None = typer.Option(None, "--check", help=f"run only this check; repeat for several "
                                            f"(of {', '.join(CHECKS)}; default: all)"),
    timeout_s: float = typer.Option(600.0, "--timeout-s", help="give up on the runtime job after this long"),
    quick: bool = typer.Option(False, "--quick", help="the activations check at a 256-token micro-batch instead of "
                               "2,048: a layer keeps the same bytes per token at any length, with an eighth of the matmuls"),
    json_out: bool = json_option("print the environment and every check's result as JSON"),
) -> None:
    """Check this machine for training with hydraplan's runtime: report torch, CUDA, NCCL and the attention
    backend; check every available attention backend against SDPA (plain, GQA, bottom-right windows, forward
    and backward); smoke-test the collectives the runtime uses (uneven all_to_all, batch_isend_irecv, new
    groups); replay small plans (plain, TP+PP, CP, Seq1F1B, CAD) in the device's dtype against the fp64
    reference; compare each rank's measured peak memory with the memory model, and what one LLaMA-2 7B layer keeps
    for its backward with the model's per-token term. One table, exit 1 on any
    failure. Without GPUs it runs the same on CPU with gloo."""
    import json

    from hydraplan.app.measure import failure_line, launch_runtime

    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda (got {device!r})")
    todo = list(checks or CHECKS)
    if unknown := [c for c in todo if c not in CHECKS]:
        raise UserError(f"--check: {unknown[0]!r} is not one of {', '.join(CHECKS)}")
    positive(ranks, "--ranks")
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is visible")
    n = ranks or (torch.cuda.device_count() if device == "cuda" else 4)
    with console.status(f"running the doctor's checks on {n} {device} ranks"):
        args = ["--checks", ",".join(todo), "--timeout-s", str(timeout_s), *(["--quick"] if quick else [])]
        res = launch_runtime(MODULE, args, n, device, timeout_s)
    report = res.result or {"environment": {}, "checks": []}
    done = {c["check"] for c in report["checks"]}
    if res.returncode != 0:  # the job ended early: the check that was running failed, with the job's one line
        missing = next((c for c in todo if c not in done), "runtime job")
        report["checks"].append({"check": missing, "passed": False,
                                 "detail": failure_line(res.stderr, "doctor") or f"the runtime job exited {res.returncode}"})
    failed = [c["check"] for c in report["checks"] if not c["passed"]]
    if json_out:
        typer.echo(json.dumps({**report, "passed": not failed}, indent=1))
    else:
        _print(report)
    if failed:
        raise typer.Exit(1)


def _print(report: dict) -> None:
    env = report["environment"]
    table = Table("check", "result", "detail", title="hydraplan doctor", title_justify="left")
    if env:
        table.add_row("environment", "info", f"torch {env['torch']}, CUDA {env['cuda'] or '-'}, NCCL {env['nccl'] or '-'}; "
                      f"{env['ranks']} {env['backend']} ranks on {env['device']}, {env['dtype']}; attention "
                      f"{env['attention']}; communicators warmed up in {env['warm_up_s']:.2f}s")
    for c in report["checks"]:
        table.add_row(c["check"], "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]", c["detail"])
    console.print(table)
