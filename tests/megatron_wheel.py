"""Megatron's own scheduler code, loaded from the megatron-core wheel `make setup` downloads (.cache/megatron), with
stand-ins for the Megatron and torch modules it imports (only names used at import time), so tests run it on CPU.
Nothing of Megatron is copied into the repository: the file is read from the wheel at test time."""

from __future__ import annotations

import sys
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL_DIR = ROOT / ".cache" / "megatron"
HYBRID_CP = "megatron/core/pipeline_parallel/hybrid_cp_schedule.py"
DATA_SCHEDULE = "megatron/core/datasets/data_schedule.py"


def wheel() -> Path:
    found = sorted(WHEEL_DIR.glob("megatron_core-0.19.2-*.whl"))
    if not found:
        raise FileNotFoundError(f"{WHEEL_DIR}: no megatron-core 0.19.2 wheel; `make setup` downloads it")
    return found[0]


def source(member: str) -> str:
    with zipfile.ZipFile(wheel()) as z:
        return z.read(member).decode()


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def load_hybrid_cp_schedule() -> types.ModuleType:
    """megatron.core.pipeline_parallel.hybrid_cp_schedule, executed against stand-ins (never put in sys.modules)."""
    dist = _stub("torch.distributed", ProcessGroup=object)
    stubs = {
        "torch": _stub("torch", distributed=dist),
        "torch.distributed": dist,
        "megatron": _stub("megatron"),
        "megatron.core": _stub("megatron.core", parallel_state=_stub("megatron.core.parallel_state")),
        "megatron.core.parallel_state": _stub("megatron.core.parallel_state"),
        "megatron.core.rerun_state_machine": _stub("megatron.core.rerun_state_machine", RerunDataIterator=object),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        mod = types.ModuleType("megatron_hybrid_cp_schedule")
        exec(compile(source(HYBRID_CP), HYBRID_CP, "exec"), mod.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


class Group:
    """A process group as BalancedCPScheduler sees it: only its size."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n


def megatron_schedule(mod: types.ModuleType, lengths, limit: int, n: int) -> list[list[list[int]]]:
    """Megatron's BalancedCPScheduler on (position, length) pairs: its sample_id_groups."""
    sched = mod.BalancedCPScheduler(max_seq_len_per_rank=limit, dp_cp_group=Group(n))
    _, groups = sched.get_groups_and_subsamples([(i, int(l)) for i, l in enumerate(lengths)], None)
    return [[list(x) for x in rnd] for rnd in groups]
