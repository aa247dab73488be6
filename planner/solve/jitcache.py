"""Whether the compiled solvers (numba, `cache=True`) are cached yet, told without importing numba.

The first run after an install compiles them, which takes a minute and looks like a hang; the app says so
beforehand. numba keeps each function's cache beside its module (`__pycache__/<module>.<function>-<line>.pyXY.nbi`)
and recompiles when the module is newer than its cache. Where numba would use another folder (NUMBA_CACHE_DIR, or a
read-only install), the answer is unknown and taken as cached: better no word than a wrong one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SOLVE = Path(__file__).resolve().parent


def compiled_modules(root: Path = SOLVE) -> list[Path]:
    """The modules under `root` whose own functions are compiled (decorated)."""
    return sorted(p for p in root.rglob("*.py")
                  if p != Path(__file__).resolve() and "@numba.njit" in p.read_text(encoding="utf-8"))


def solvers_cached(root: Path = SOLVE) -> bool:
    if os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("NUMBA_DISABLE_JIT"):
        return True
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    for module in compiled_modules(root):
        cache = module.parent / "__pycache__"
        if not os.access(cache if cache.is_dir() else module.parent, os.W_OK):
            return True
        stamp = module.stat().st_mtime
        if not any(p.stat().st_mtime >= stamp for p in cache.glob(f"{module.stem}.*.{tag}.nbi")):
            return False
    return True
