"""Profiles on disk: the bundled ones by name, profile JSON files, and the regenerated analytic set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydraplan.core.analytic import analytic_profiles
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Profile
from hydraplan.store.fileio import load_model, write_model
from hydraplan.store.paths import PROFILES_DIR


def bundled_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """A bundled profile by name (e.g. h100-llama2-7b) or a path to a profile JSON."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return load_model(Profile, path)
    bundled = PROFILES_DIR / f"{name_or_path}.json"
    if bundled.exists():
        return load_model(Profile, bundled)
    names = ", ".join(p.stem for p in bundled_profiles())
    raise UserError(f"unknown profile {name_or_path!r}: not a file, and not a bundled profile ({names})")


def write_analytic_profiles(out_dir: Path = PROFILES_DIR) -> list[Path]:
    """Regenerate the bundled analytic profiles (deterministic: same bytes every run)."""
    paths = []
    for profile in analytic_profiles():
        path = Path(out_dir) / f"{profile.name}.json"
        write_model(path, profile)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------- listing / show
@dataclass(frozen=True)
class ProfileEntry:
    name: str  # what --profile accepts
    gpu: str
    model: str
    schemes: int
    source: str
    path: str


def list_bundled() -> list[ProfileEntry]:
    entries = []
    for path in bundled_profiles():
        p = load_model(Profile, path)
        entries.append(ProfileEntry(path.stem, p.gpu.name, p.model.name, len(p.schemes), p.source, str(path)))
    return entries
