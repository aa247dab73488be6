"""The file formats of docs/formats.md as pydantic models: the public name of hydraplan.core.schema."""

from hydraplan.core.schema import *  # noqa: F403
from hydraplan.core.schema import __all__  # noqa: F401
