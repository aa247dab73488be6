"""The one exception a user mistake raises; the CLI prints it as one line and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: a message naming the file, field and value. Never shown with a traceback.

    Below app/ a setting is named by its field (`gpus`, `context_len`), never by a command-line flag: the planner
    has callers without a command line (the runtime's online planning, plugins). A message about one setting
    starts with its field and passes it as `field`, so app/ can show the flag the user typed in its place."""

    def __init__(self, message: str, field: str | None = None) -> None:
        if field is not None and not message.startswith(field):
            raise ValueError(f"a UserError about {field!r} must start with it: {message!r}")
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type[UserError], tuple[str, str | None]]:  # keeps `field` across a process pool
        return type(self), (str(self), self.field)


def flag_of(field: str) -> str:
    """The option that sets a field: every command spells a setting `--` + its field in kebab case."""
    return "--" + field.replace("_", "-")


def cli_message(e: UserError) -> str:
    """The error's one line as a command line says it: a message about a field names its flag instead."""
    text = str(e)
    return flag_of(e.field) + text[len(e.field):] if e.field else text
