"""The one exception a user mistake raises; the CLI prints it as one line and exits 2."""


class UserError(Exception):
    """Bad input: a message naming the file, field and value. Never shown with a traceback."""
