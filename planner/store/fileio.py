"""Reading and writing the JSON files of schema.py: atomic writes, one-line errors for bad files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hydraplan.core.errors import UserError

M = TypeVar("M", bound=BaseModel)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_validation_error(source: str, err: ValidationError) -> str:
    """First error of a pydantic ValidationError as 'file: field a.b.0: message (got value)'."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    got = f" (got {_short(first['input'])})" if first["type"] != "missing" else ""
    return f"{source}: field {loc}: {first['msg']}{got}"


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a JSON file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def parse_model(cls: type[M], data: Any, source: str) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise UserError(describe_validation_error(source, e)) from None


def load_model(cls: type[M], path: str | Path) -> M:
    """A file as its model; a file format with a `schema` tag must carry it (a model built in Python gets it
    by default, a file without one is refused, as docs/formats.md says)."""
    data = read_json(path)
    tag = cls.model_fields.get("schema_")
    if tag is not None and isinstance(data, dict) and "schema" not in data:
        raise UserError(f"{path}: field schema: missing (this file must start with {{\"schema\": \"{tag.default}\", ...}})")
    return parse_model(cls, data, str(path))


def model_json(model: BaseModel) -> str:
    return model.model_dump_json(by_alias=True, exclude_none=True, indent=1)


def _file_mode() -> int:
    """The mode open() would give a new file (0666 minus the umask); mkstemp's own 0600 would hide plans
    from the other users and tools of a shared cluster."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def ensure_folder(path: str | Path, what: str) -> Path:
    """An output folder, created with its parents; one line naming it (`what`: how the caller names it) when
    that is impossible (a file in the way, no permission, a read-only file system)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot create the folder: {e.strerror or e}") from None
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename, so readers never see half a file; the
    parent folder is created. Any OS failure is a UserError naming the file."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder, expected a file name")
    ensure_folder(path.parent, f"{path}: its folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror or e}") from None
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def save_figure(fig: Any, path: str | Path, dpi: int) -> None:
    """A matplotlib figure as a PNG, written atomically like every other output."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(path, buf.getvalue())


def write_model(path: str | Path, model: BaseModel) -> None:
    atomic_write_text(path, model_json(model) + "\n")


def write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
