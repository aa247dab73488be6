"""The `hydraplan` command line: the typer app and its commands (app/cmd_*.py: thin, they call into the layers below)."""

from __future__ import annotations

import typer

from hydraplan.app import cliopts, cmd_doctor, cmd_files, cmd_megatron, cmd_plan, cmd_profile
from hydraplan.app.cliopts import CONTEXT_SETTINGS

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
app.add_typer(cmd_megatron.megatron_app, name="megatron")


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=cliopts.version_callback, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """Plan heterogeneous, length-aware LLM training: propose strategies, pack iterations, compare."""


for command in (cmd_files.schema, cmd_plan.propose, cmd_plan.pack, cmd_plan.validate, cmd_plan.compare,
                cmd_files.pipeline):
    app.command()(command)
app.command("profile")(cmd_profile.profile_cmd)
app.command("doctor")(cmd_doctor.doctor)
dataset_app.command("stats")(cmd_files.dataset_stats)
profiles_app.command("list")(cmd_files.profiles_list)
profiles_app.command("show")(cmd_files.profiles_show)
profiles_app.command("memory")(cmd_files.profiles_memory)
profiles_app.command("time")(cmd_files.profiles_time)
profiles_app.command("generate")(cmd_files.profiles_generate)
cliopts.reflow_help(app, profiles_app, dataset_app, cmd_megatron.megatron_app)


def main() -> None:
    cliopts.run(_invoke)


def _invoke() -> None:
    """The app outside typer's standalone mode, so a usage error (an unknown flag, `--tokens-per-iter 1e9`) is one
    line and exit 2, as every other user mistake, not a boxed panel; `-h`, `--version` and exit codes as before."""
    import sys

    click = sys.modules[typer.BadParameter.__module__]  # click.exceptions, or typer's own copy of it
    try:
        code = app(standalone_mode=False)
    except click.NoArgsIsHelpError as e:  # typer has printed the help already
        sys.exit(e.exit_code)
    except click.ClickException as e:
        ctx = getattr(e, "ctx", None)
        command = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip() if ctx is not None else ""
        where = f"{command}: " if command else ""
        hint = f" ({' '.join(['hydraplan', *command.split(), '-h'])})" if isinstance(e, click.UsageError) else ""
        print(f"hydraplan: {where}{' '.join(e.format_message().split())}{hint}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    if isinstance(code, int) and code:
        sys.exit(code)
