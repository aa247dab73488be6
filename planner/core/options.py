"""Command-line options declared on the config models themselves: a field annotated `Annotated[T, Opt(help)]`
is an option of every command built from its model (`hydraplan pack` by app/cliopts.py, the runtime's
planning while training by runtime/online.py, run_plan's own by runtime/train_config.py), so its name, type,
default and help are written once."""

from __future__ import annotations

import argparse
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, PositiveInt
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Opt:
    """A field's command-line form. The flag is `--` + the field in kebab case; a boolean that defaults to True is
    turned off by `--no-` + it, unless `off` names the flag that turns it off (then both flags exist, as
    `--synthesize/--candidates-only`, and giving neither leaves the model's default). `online`: also a flag of
    the runtime's planning while training (runtime/online.py). `metavar` and `positional` (an optional argument
    without a flag) are argparse's, for run_plan's own options (runtime/train_config.py)."""

    help: str
    off: str | None = None
    online: bool = True
    metavar: str | None = None
    positional: bool = False


@dataclass(frozen=True)
class Option:
    """One declared option: its field, where it sits (`path`: the nested models above it), its form and type."""

    name: str
    path: tuple[str, ...]
    field: FieldInfo
    opt: Opt

    @property
    def flag(self) -> str:
        if self.opt.positional:
            return self.name
        kebab = "--" + self.name.replace("_", "-")
        return "--no-" + kebab[2:] if self.negated else kebab

    @property
    def negated(self) -> bool:
        """A flag that sets the field False (`--no-static`): a boolean on by default with no `off` pair."""
        return self.kind is bool and self.field.default is True and self.opt.off is None

    @property
    def required(self) -> bool:
        return self.field.is_required()

    @property
    def default(self) -> Any:
        return None if self.required else self.field.default

    @property
    def kind(self) -> type:
        """The type the command line parses: bool, int, float, Path, or str (literals and unions of a number
        and a word, such as `seq1f1b`, arrive as text and the model validates them)."""
        return cli_type(self.field.annotation)

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The values of a literal field (`Literal["a", "b"] | None`: a, b), else None."""
        return literal_values(self.field.annotation)


def cli_type(annotation: Any) -> type:
    if get_origin(annotation) is Annotated:
        return cli_type(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = {cli_type(a) for a in get_args(annotation) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else str
    if get_origin(annotation) is Literal:
        return str
    return annotation if annotation in (bool, int, float, Path) else str


def literal_values(annotation: Any) -> tuple[Any, ...] | None:
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    if get_origin(annotation) in (Annotated, Union, types.UnionType):
        found = [v for a in get_args(annotation) if (v := literal_values(a)) is not None]
        return found[0] if len(found) == 1 else None
    return None


def add_flags(ap: argparse._ActionsContainer, declared: Iterable[Option], typed: bool = False) -> None:
    """The options as argparse arguments. A flag not given is None, so that the model's default applies and a
    caller can tell what was given, and the model refuses a bad value in its own words (as `pack` does);
    `typed`: argparse applies the declared defaults and refuses a literal's other values itself (run_plan's own)."""
    for o in declared:
        default = o.default if typed else None
        if o.kind is bool:
            ap.add_argument(o.flag, dest=o.name, action="store_const", const=not o.negated, default=default,
                            help=o.opt.help)
            if o.opt.off is not None:
                ap.add_argument(o.opt.off, dest=o.name, action="store_const", const=False, help=f"not {o.flag}")
            continue
        where: dict[str, Any] = {"nargs": "?"} if o.opt.positional else {"dest": o.name}
        ap.add_argument(o.flag, **where, type=o.kind, default=default, metavar=o.opt.metavar,
                        choices=o.choices if typed else None, help=o.opt.help)


def options(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[Option]:
    """The declared options of a model in field order, those of a nested model in its place."""
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from options(sub, (*path, name))
            continue
        opt = next((m for m in field.metadata if isinstance(m, Opt)), None)
        if opt is not None:
            yield Option(name, path, field, opt)


def nest(model: type[BaseModel], values: dict[str, Any]) -> dict[str, Any]:
    """Flat option values (as a command line gives them) placed into the model's nested models by field name."""
    out = dict(values)
    for name, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and name not in values:
            inner = {k: out.pop(k) for k in list(out) if k in _names(sub)}
            if inner:
                out[name] = nest(sub, inner)
    return out


def _names(model: type[BaseModel]) -> set[str]:
    """The field names of a model and of the models nested in it."""
    out = set(model.model_fields)
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _names(field.annotation)
    return out


Objective = Literal["end-to-end", "propagation"]  # what a run minimizes; core/cluster.py interprets it

# the options `pack`, `propose` and `compare` share, each declared once
ProfileName = Annotated[str, Opt("bundled profile name or profile JSON")]
DatasetName = Annotated[str, Opt("length file or builtin:wikipedia / builtin:prolong", online=False)]
Gpus = Annotated[PositiveInt, Opt("GPUs in the job", online=False)]  # the runtime's is its world size
TokensPerIter = Annotated[PositiveInt, Opt("token budget of one iteration's batch")]
CONTEXT_LEN_HELP = "longest sequence in tokens; longer documents are truncated to it (default: the dataset's longest)"
ContextLen = Annotated[PositiveInt | None, Opt(CONTEXT_LEN_HELP)]
ObjectiveOpt = Annotated[Objective, Opt("what to minimize: end-to-end (propagation + exposed LNK pull/push, "
                                        "docs/formats.md) or propagation (the paper's objective)")]
