"""Peak heap bytes of this process on CPU, from the C allocator's own statistics.

torch allocates CPU tensors with the C allocator (posix_memalign) and keeps no statistics of its own there,
so the in-use bytes are glibc's: mallinfo2's `uordblks` (bytes in use in the heap arenas) plus `hblkhd`
(bytes in chunks large enough to get their own mmap, i.e. most tensors). `PeakHeap` samples them after every
torch operation (a TorchDispatchMode sees forward and backward ops alike), which is when an output has just
been allocated and its inputs are still alive: the peak between operations. Buffers an operation allocates
and frees internally are not seen. Without glibc (macOS, musl) `heap_bytes` is None and nothing is measured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

from torch.utils._python_dispatch import TorchDispatchMode


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


_M_MMAP_THRESHOLD = -3


def map_large_allocations(threshold: int = 1 << 16) -> None:
    """Give every allocation of `threshold` bytes or more its own mmap, freed at once when released. glibc
    otherwise raises its mmap threshold after large frees and serves later tensors from the heap, where
    freed memory lingers in bins and which thread allocated decides the arena: the in-use figures then
    drift by several MB between identical runs. Call before measuring; a no-op without glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):
        pass


def heap_bytes() -> int | None:
    """Bytes the C allocator has handed out and not taken back (None: not glibc >= 2.33)."""
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return int(m.uordblks + m.hblkhd)


_frozen = False


def collect() -> None:
    """Garbage collection before a memory measurement (buffers of earlier collectives freed now, not inside the
    measured window), without walking the objects torch's modules made at import on every call (~0.5 CPU s each):
    what is alive at the first call is left out of later passes (gc.freeze), so call it once set up."""
    global _frozen
    gc.collect()
    if not _frozen:
        gc.freeze()
        _frozen = True


class PeakHeap(TorchDispatchMode):
    """with PeakHeap() as p: ...  -> p.peak: the most heap bytes in use after any torch operation inside (and at
    entry), p.start: at entry."""

    def __enter__(self):
        self.start = self.peak = heap_bytes() or 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        now = heap_bytes()
        if now is not None and now > self.peak:
            self.peak = now
        return out
