"""Below app/ an error names a setting by its field, never by a command-line flag; app/ shows the flag."""

from __future__ import annotations

import ast
import functools
import pickle
import re
from pathlib import Path

import click
import pytest
import typer

from hydraplan.app.cli import app
from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError, cli_message, flag_of
from hydraplan.store.profiles import load_profile

PLANNER = Path(__file__).resolve().parents[1] / "planner"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@functools.cache
def errors_below_app() -> list[tuple[str, ast.AST]]:
    """What makes an error's text below app/: every raise, every UserError built (raised or returned), and every
    default argument value (`what="--out"` would reach a message)."""
    out = []
    for path in sorted(PLANNER.rglob("*.py")):
        if path.relative_to(PLANNER).parts[0] == "app":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(PLANNER)}:{getattr(node, 'lineno', '')}"
            if isinstance(node, ast.Raise) and node.exc is not None:
                out.append((where, node.exc))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UserError":
                out.append((where, node))
            elif isinstance(node, ast.arguments):
                out += [(where, d) for d in (*node.defaults, *node.kw_defaults) if d is not None]
    return out


def strings(node: ast.AST) -> list[str]:
    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def test_no_error_below_app_names_a_flag():
    scanned = errors_below_app()
    found = [f"{where}: {FLAG.findall(s)}" for where, node in scanned for s in strings(node) if FLAG.search(s)]
    assert len(scanned) > 100 and not found, found


def cli_options() -> set[str]:
    def walk(command: click.Command) -> set[str]:
        flags = {o for p in command.params for o in p.opts if o.startswith("--")}
        for sub in getattr(command, "commands", {}).values():
            flags |= walk(sub)
        return flags

    return walk(typer.main.get_command(app))


def test_every_field_an_error_names_below_app_is_an_option():
    """The fields passed to UserError below app/ (the literal second argument), each shown as an existing flag."""
    fields = {node.args[1].value for _, node in errors_below_app()
              if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UserError"
              and len(node.args) == 2 and isinstance(node.args[1], ast.Constant)}
    assert {"gpus", "context_len", "tokens_per_iter", "objective", "seq1f1b"} <= fields
    assert {flag_of(f) for f in fields} <= cli_options(), sorted({flag_of(f) for f in fields} - cli_options())


def test_the_cli_names_the_flag_in_place_of_the_field():
    with pytest.raises(UserError) as e:
        Cluster.of(load_profile("h100-llama2-7b"), 0)
    assert str(e.value) == "gpus must be positive (got 0)" and e.value.field == "gpus"
    assert cli_message(e.value) == "--gpus must be positive (got 0)"
    with pytest.raises(UserError) as e:
        Cluster.of(load_profile("h100-llama2-7b"), 8, "fastest")
    assert cli_message(e.value) == "--objective must be end-to-end or propagation (got 'fastest')"
    assert cli_message(UserError("plan.json: field gpus: 0")) == "plan.json: field gpus: 0"  # no field: as raised


def test_the_field_survives_a_process_pool_and_leads_the_message():
    e = pickle.loads(pickle.dumps(UserError("context_len must be positive (got 0)", "context_len")))
    assert (str(e), e.field) == ("context_len must be positive (got 0)", "context_len")
    with pytest.raises(ValueError, match="must start with it"):
        UserError("must be positive", "gpus")
