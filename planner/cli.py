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


def main() -> None:
    try:
        app()
    except UserError as e:
        err_console.print(f"hydraplan: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
