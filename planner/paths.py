"""Where the bundled profiles and datasets live (the repository root of an editable install)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES_DIR = ROOT / "profiles"
DATA_DIR = ROOT / "data"
