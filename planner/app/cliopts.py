"""The conventions every `hydraplan` command shares, in one place (README "Command-line conventions").

- `-h`/`--help` and `--version`; flags show as `--json`, never `--json <bool>`.
- `--out` names what a command writes (a file or a folder, as its help says); it is checked, and a folder
  created, before any work, so a bad path fails at once, not after minutes of planning.
- `--json` prints the machine-readable form on stdout instead of the table.
- `--context-len` defaults to the dataset's longest document and must be a positive number of tokens;
  counts (`--gpus`, `--iterations`, `--tokens-per-iter`, `--workers`) must be positive.
- A user mistake or an OS failure to read or write: one line on stderr naming the file, field or value,
  exit 2. Ctrl-C, SIGTERM or SIGHUP: one line (saying how to resume, where a command can), exit 128 + signal.
- Progress goes to stderr: a bar on a terminal; elsewhere (logs, CI) a line at least every 10 s.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from hydraplan.core.errors import UserError, cli_message

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.table import Table

    from hydraplan.core.options import Option

M = TypeVar("M", bound="BaseModel")

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
console = Console()
err_console = Console(stderr=True)
PROGRESS_EVERY_S = float(os.environ.get("HYDRAPLAN_PROGRESS_EVERY_S", "10"))


# ------------------------------------------------------------------------------------------- options
def json_option(help: str = "print the machine-readable form (JSON) instead of the table") -> Any:
    return typer.Option(False, "--json", help=help)


def context_len_option(help: str = "longest sequence in tokens; longer documents are truncated to it "
                       "(default: the dataset's longest)") -> Any:
    return typer.Option(None, "--context-len", help=help)


def config_command(model: type[M], **own: tuple[Any, Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A typer command whose options are the model's declared ones (core/options.py), then its `own` (name ->
    (type, typer.Option)). The command function takes the config, built once from the flags (app/config.py
    `build`: one line for a bad value), and its own values."""
    import functools
    import inspect

    from hydraplan.core.options import options
    from hydraplan.job.config import build

    declared = sorted(options(model), key=lambda o: not o.required)  # the required ones first, as `--help` lists them
    params = [inspect.Parameter(_param(o), inspect.Parameter.KEYWORD_ONLY, default=_typer_option(o), annotation=_cli_type(o))
              for o in declared]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
               for name, (kind, default) in own.items()]

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def command(**values: Any) -> None:
            given = {o.name: _model_value(o, values.pop(_param(o))) for o in declared}
            fn(build(model, **given), **values)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def _param(o: Option) -> str:
    return o.flag[2:].replace("-", "_")


def _cli_type(o: Option) -> Any:
    return o.kind if o.required or (o.default is not None and o.opt.off is None) else o.kind | None


def _typer_option(o: Option) -> Any:
    """A negated flag (`--no-static`) defaults to False; a pair (`--synthesize/--candidates-only`) to None, so
    that giving neither leaves the model's default."""
    if o.negated:
        return typer.Option(False, o.flag, help=o.opt.help)
    if o.opt.off is not None:
        return typer.Option(None, f"{o.flag}/{o.opt.off}", help=o.opt.help)
    return typer.Option(... if o.required else o.default, o.flag, help=o.opt.help)


def _model_value(o: Option, value: Any) -> Any:
    return (not value) if o.negated else value


def positive(value: int | float | None, flag: str, what: str = "a positive integer") -> None:
    """One wording for every count option: `--gpus must be a positive integer (got 0)`."""
    if value is not None and not value > 0:
        raise UserError(f"{flag} must be {what} (got {value})")


def scheme_key(text: str, flag: str, mode: str | None = "none") -> tuple[int, int, int, str | None]:
    """A scheme written TP,PP,CP,MODE (or TP,PP,CP: recomputation `mode`; TP,PP: cp = 1; angle brackets allowed) as
    its key, or UserError."""
    from hydraplan.core.schema import RECOMPUTE_MODES

    parts = [p.strip() for p in text.replace("<", "").replace(">", "").split(",")]
    if len(parts) == 4:
        mode = parts.pop()
    if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts) or mode not in (None, *RECOMPUTE_MODES):
        raise UserError(f"{flag}: {text!r} is not TP,PP, TP,PP,CP or TP,PP,CP,MODE (positive integers, MODE one of "
                        f"{', '.join(RECOMPUTE_MODES)})")
    return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else 1, mode


def check_context_len(value: int | None) -> None:
    positive(value, "--context-len", "a positive number of tokens")


def out_file(path: Path, flag: str = "--out") -> Path:
    """A file to write: not an existing folder, its folder creatable (created now)."""
    from hydraplan.store.fileio import ensure_folder

    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder, expected a file name")
    ensure_folder(path.parent, f"{flag} {path}: its folder")
    return path


def png_file(path: Path, flag: str = "--plot") -> Path:
    if path.suffix.lower() != ".png":
        raise UserError(f"{flag} {path}: expected a file name ending in .png")
    return out_file(path, flag)


def out_folder(path: Path, flag: str = "--out") -> Path:
    from hydraplan.store.fileio import ensure_folder

    return ensure_folder(path, flag)


# -------------------------------------------------------------------------------------------- output
def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 plan`, `2 plans` (`many`: an irregular plural)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def print_table(table: Table, piped_width: int = 160) -> None:
    """Print a table without cutting a cell: columns wrap at spaces (a strategy between its schemes), and a
    word wider than its column (a plan file's path, a scheme on a narrow terminal) folds onto the next line
    instead of ending in an ellipsis. (A column's min_width would not help: rich keeps it even when the table
    then overflows the terminal, and the console crops the last columns.) Where stdout is not a terminal (a
    log, a pipe) rich would assume 80 columns; the table gets `piped_width` there."""
    for column in table.columns:
        column.no_wrap, column.overflow = False, "fold"
    (console if console.is_terminal else Console(width=piped_width)).print(table)


# ------------------------------------------------------------------------------------------ progress
class Heartbeat:
    """A status line on stderr at least every `every_s` seconds while the block runs, for runs whose
    stderr is not a terminal (there a progress bar shows the same); `line()` says where the run is."""

    def __init__(self, line: Callable[[], str], every_s: float = PROGRESS_EVERY_S, enabled: bool | None = None):
        self.line, self.every_s = line, every_s
        self.enabled = (not sys.stderr.isatty()) if enabled is None else enabled
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hydraplan-heartbeat", daemon=True)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            print(f"{self.line()} [{self.elapsed_s:.0f} s]", file=sys.stderr, flush=True)

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


# -------------------------------------------------------------------------------------- entry point
class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP, raised in the main thread so `finally` blocks record what is done."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_HINT: list[str] = []


def on_interrupt(hint: str) -> None:
    """What the interrupted-run line should add, e.g. how to resume."""
    _HINT[:] = [hint]


def _raise_interrupted(signum: int, frame: object) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal stops at once
        signal.signal(s, signal.SIG_DFL)
    raise Interrupted(signum)


def _say(text: str) -> None:
    print(f"hydraplan: {text}", file=sys.stderr, flush=True)


def _stop(e: Interrupted) -> None:
    name = signal.Signals(e.signum).name
    _say(f"interrupted ({name})" + (f"; {_HINT[0]}" if _HINT else ""))
    sys.exit(128 + e.signum)


def run(command: Callable[[], Any]) -> None:
    """Run the CLI with the exit codes above: 2 for a UserError or OS error, 128 + signal number when
    interrupted; never a traceback for either."""
    import warnings

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_interrupted)
    warnings.showwarning = lambda message, *_: _say(f"warning: {message}")
    try:
        command()
    except UserError as e:
        _say(cli_message(e))
        sys.exit(2)
    except Interrupted as e:
        _stop(e)
    except SystemError as e:  # the signal landed in a Python callback of compiled code (numba's dispatcher)
        if not isinstance(e.__cause__, Interrupted):
            raise
        _stop(e.__cause__)
    except OSError as e:  # an OS failure no check caught: still one line naming the file
        where = f"{e.filename}: " if e.filename else ""
        _say(f"{where}{e.strerror or e}")
        sys.exit(2)


def reflow_help(*apps: typer.Typer) -> None:
    """Join each help paragraph's source lines: typer's rich help keeps a docstring's line breaks, so a
    paragraph wrapped at 110 columns in the source would break mid-sentence on an 80-column terminal."""
    import inspect

    for app in apps:
        for info in app.registered_commands:
            doc = info.help or (info.callback.__doc__ if info.callback else None)
            if doc:
                info.help = "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


def version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"hydraplan {version('hydraplan')}")
        raise typer.Exit()


def _flags_show_no_type() -> None:
    """typer renders boolean flags as `--json <bool>`; a flag takes no value, so show none."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]  # patching typer's method on purpose


_flags_show_no_type()
