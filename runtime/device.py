"""The one seam through which the runtime times and measures its device: a clock, peak memory, synchronization.

Everything that reports seconds or bytes (run_plan's phases and `--memory`, LNK pull/push and CAD attention
timings, runtime/profile.py, `hydraplan profile`, `hydraplan doctor`) goes through a `Device`, because the
host's view is wrong on a GPU: kernels and NCCL collectives are asynchronous (the host returns as soon as
they are queued, and an NCCL future completes when its work is queued, not when it ran), and tensors live
in device memory that the C heap never sees.

- `CpuDevice` (gloo): stamps are `time.time()` (comparable across the ranks of a host), collectives are
  waited for on the host, peak memory is the C allocator's heap statistics (runtime/memstats.py).
- `CudaDevice` (NCCL), after CUDA's documented semantics: a stamp is a CUDA event recorded on the calling
  thread's current stream (`enable_timing=True`), resolved to wall seconds after a synchronize as
  `anchor + anchor_event.elapsed_time(event) / 1000`, the anchor being an event recorded on an idle device
  at a known `time.time()` (`anchor()`, once per step); a collective's completion is an event recorded on a
  timing stream made to wait for it (`Work.wait()` makes the *current stream* wait, not the host); peak
  memory is `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`; side streams carry LNK's
  packing so the compute stream waits only where it needs the data (`event` / `wait_for`), and buffers
  used on another stream than the one that allocated them are recorded there (`record_stream`) so the
  caching allocator does not hand them out again too early. TF32 matmuls are allowed (`configure`).
  The torch.cuda module is a constructor argument, so tests drive these branches with a stand-in.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from hydraplan.runtime.memstats import PeakHeap, heap_bytes

_STREAMS_LOCK = threading.Lock()
DtypeName = Literal["bf16", "fp32", "fp64"]
DTYPES: dict[DtypeName, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}
"""Compute dtypes of the runtime's --dtype: bf16 is the GPU default (FlashAttention kernels, bf16 GEMMs), fp32 the
CPU one, fp64 exact verification."""


@dataclass
class PeakReading:
    """Bytes in use when the measured window opened (`start`) and the most at any point inside (`peak`)."""

    start: int = 0
    peak: int = 0


class Device:
    """What the runtime needs of its device beyond tensors (see the module docstring); CPU semantics."""

    kind = "cpu"
    backend = "gloo"

    def __init__(self, index: int | None = None):
        self.torch = torch.device(self.kind) if index is None else torch.device(self.kind, index)

    # --------------------------------------------------------------------------------- time
    def configure(self) -> None:
        """Process-wide settings for training on this device (none on CPU)."""

    def synchronize(self) -> None:
        """Wait until every queued kernel and collective of this device has run."""

    def anchor(self) -> None:
        """Start of a timed window: later stamps resolve against it (nothing to do on CPU)."""

    def stamp(self) -> Any:
        """A point in time on the calling thread's timeline of the device (resolve it with `seconds`)."""
        return time.time()

    def seconds(self, stamp: Any) -> float:
        """Wall seconds (time.time() scale) of a stamp; on CUDA only after `synchronize`."""
        return float(stamp)

    def on_complete(self, work: dist.Work, done: Callable[[Any], None], name: str) -> None:
        """Call done(stamp of the collective's completion) once it completed (`name`: whose collectives these
        are, one timing stream each on CUDA)."""
        work.get_future().add_done_callback(lambda _: done(time.time()))

    def host_wait(self, work: dist.Work) -> None:
        """Block the calling thread until the collective has run (its outputs are ready for any stream)."""
        work.wait()

    # ------------------------------------------------------------------------------ streams
    def side_stream(self, name: str) -> contextlib.AbstractContextManager:
        """Context of a helper thread's work (LNK packing), on a stream of its own named `name` on CUDA."""
        return contextlib.nullcontext()

    def event(self) -> Any:
        """A marker of the work queued so far on the current stream (None on CPU: the host already waited)."""
        return None

    def wait_for(self, marker: Any) -> None:
        """Make the current stream wait for a marker from `event` (no-op on CPU)."""

    def record_stream(self, tensor: torch.Tensor) -> None:
        """Tell the allocator that the current stream uses `tensor` (no-op on CPU)."""

    # ------------------------------------------------------------------------------ memory
    def memory_in_use(self) -> int:
        """Bytes allocated now (the C heap's statistics on CPU, 0 where they are unavailable)."""
        return heap_bytes() or 0

    @contextlib.contextmanager
    def peak_memory(self) -> Iterator[PeakReading]:
        """with dev.peak_memory() as r: ...  -> r.start, r.peak: bytes in use at entry and at the peak inside."""
        with PeakHeap() as heap:
            reading = PeakReading(heap.start, heap.start)
            yield reading
        reading.peak = heap.peak

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on this device (a plain copy on CPU)."""
        return tensor.to(self.torch)

    def describe(self) -> str:
        return "CPU (gloo)"


@dataclass
class CudaDevice(Device):
    """CUDA semantics (module docstring). `cuda`: the torch.cuda module, or a stand-in in tests."""

    index: int = 0
    cuda: Any = None
    _anchor: Any = None
    _anchor_wall: float = 0.0
    _streams: dict = field(default_factory=dict)

    kind = "cuda"
    backend = "nccl"

    def __post_init__(self):
        self.cuda = self.cuda if self.cuda is not None else torch.cuda
        self.torch = torch.device("cuda", self.index)

    def configure(self) -> None:
        self.cuda.set_device(self.index)
        torch.backends.cuda.matmul.allow_tf32 = True  # bf16 runs keep fp32 only in reductions; fp32 runs use TF32
        torch.backends.cudnn.allow_tf32 = True

    def synchronize(self) -> None:
        self.cuda.synchronize(self.index)

    def anchor(self) -> None:
        self.synchronize()
        ev = self.cuda.Event(enable_timing=True)
        ev.record()
        ev.synchronize()
        self._anchor, self._anchor_wall = ev, time.time()

    def stamp(self) -> Any:
        ev = self.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, stamp: Any) -> float:
        if self._anchor is None:
            raise RuntimeError("CudaDevice.seconds before anchor()")
        return self._anchor_wall + self._anchor.elapsed_time(stamp) / 1e3

    def _stream(self, name: str) -> Any:
        with _STREAMS_LOCK:  # helper threads ask for theirs concurrently
            if name not in self._streams:
                self._streams[name] = self.cuda.Stream(self.index)
            return self._streams[name]

    def on_complete(self, work: dist.Work, done: Callable[[Any], None], name: str) -> None:
        with self.cuda.stream(self._stream(f"timing-{name}")):  # a stream that only waits: packing is not held up
            work.wait()
            done(self.stamp())

    def host_wait(self, work: dist.Work) -> None:
        work.wait()
        self.cuda.current_stream(self.index).synchronize()

    def side_stream(self, name: str) -> contextlib.AbstractContextManager:
        self.cuda.set_device(self.index)  # the current CUDA device is per thread
        return self.cuda.stream(self._stream(name))

    def event(self) -> Any:
        ev = self.cuda.Event()
        ev.record()
        return ev

    def wait_for(self, marker: Any) -> None:
        if marker is not None:
            self.cuda.current_stream(self.index).wait_event(marker)

    def record_stream(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(self.cuda.current_stream(self.index))

    def memory_in_use(self) -> int:
        self.synchronize()
        return int(self.cuda.memory_allocated(self.index))

    @contextlib.contextmanager
    def peak_memory(self) -> Iterator[PeakReading]:
        self.synchronize()
        self.cuda.reset_peak_memory_stats(self.index)
        reading = PeakReading(self.cuda.memory_allocated(self.index), 0)
        yield reading
        self.synchronize()
        reading.peak = self.cuda.max_memory_allocated(self.index)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Pinned host memory and a non-blocking copy: the copy overlaps the queued kernels."""
        return tensor.pin_memory().to(self.torch, non_blocking=True)

    def describe(self) -> str:
        return self.cuda.get_device_name(self.index)


def default_dtype(dev: Device) -> DtypeName:
    return "bf16" if dev.kind == "cuda" else "fp32"


def pick(local_rank: int | None = None) -> Device:
    """CUDA (NCCL) when a GPU is visible, else CPU (gloo); the GPU is LOCAL_RANK's."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
        return CudaDevice(index)
    return Device()


def init_distributed(dev: Device, timeout) -> None:
    """The default process group on `dev`'s backend: under torchrun from its environment, else one process; on
    CUDA bound to the device (runtime/groups.py)."""
    dev.configure()
    bound = {"device_id": dev.torch} if dev.kind == "cuda" else {}  # NCCL: communicator now, subgroups split from it
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(dev.backend, timeout=timeout, **bound)
    else:
        dist.init_process_group(dev.backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **bound)
