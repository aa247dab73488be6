"""Where the bundled profiles and datasets live: hydraplan/profiles and hydraplan/data in an installed
wheel (package data), the repository's profiles/ and data/ in a checkout (editable install)."""

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # hydraplan/ (this file is hydraplan/store/paths.py)
ROOT = PACKAGE.parent
"""The repository root in a checkout (bench/ and tests/ write and read there); site-packages when installed."""


def _bundled(name: str) -> Path:
    installed = PACKAGE / name
    return installed if installed.is_dir() else ROOT / name


PROFILES_DIR = _bundled("profiles")
DATA_DIR = _bundled("data")
