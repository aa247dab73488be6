"""The device seam (runtime/device.py): CUDA's branches driven by a stand-in of torch.cuda that keeps a timeline
(events record the instant their stream reaches them, kernels and collectives take time on it), so what CPU
can show of them is shown: stamps resolve to wall seconds through one anchor, completions and peaks come
from the device, not the host; and what the LNK streams ask of it on a GPU (markers, stream waits,
record_stream) in the order CUDA needs."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hydraplan.runtime import device as devices
from hydraplan.runtime.device import CudaDevice, Device
from hydraplan.runtime.lnk import Role, plan_link
from hydraplan.runtime.lnk_streams import LinkClock, PullStream, PushStream
from hydraplan.runtime.verify import fp64_attention_refusal
from hydraplan.schema import BatchSeq, Estimate, MicroBatch, Plan, PlanPipeline


class FakeCuda:
    """torch.cuda as the seam uses it, on a simulated device clock (ms): `now` is how far the GPU has run."""

    def __init__(self):
        self.now = 0.0
        self.calls: list[str] = []
        self.allocated, self.peak = 100, 100
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.t = None

            def record(self, stream=None):
                self.t = fake.now
                fake.calls.append("record")

            def synchronize(self):
                fake.calls.append("event.synchronize")

            def elapsed_time(self, other) -> float:
                return other.t - self.t

        class Stream:
            def __init__(self, index=0):
                self.waits = []

            def synchronize(self):
                fake.calls.append("stream.synchronize")

            def wait_event(self, ev):
                self.waits.append(ev)

        self.Event, self.Stream = Event, Stream
        self.default = Stream()

    def set_device(self, i):
        self.calls.append(f"set_device {i}")

    def synchronize(self, i=None):
        self.calls.append("synchronize")

    def current_stream(self, i=None):
        return self.default

    @contextlib.contextmanager
    def stream(self, s):
        self.calls.append("stream")
        yield

    def reset_peak_memory_stats(self, i=None):
        self.calls.append("reset_peak")
        self.peak = self.allocated

    def memory_allocated(self, i=None):
        return self.allocated

    def max_memory_allocated(self, i=None):
        return self.peak

    def get_device_name(self, i=0):
        return "Fake GPU"


def test_cuda_stamps_are_events_resolved_through_one_anchor(monkeypatch):
    fake = FakeCuda()
    dev = CudaDevice(1, cuda=fake)
    monkeypatch.setattr(devices.time, "time", lambda: 1000.0)
    fake.now = 5.0
    dev.anchor()  # an idle device: the anchor event runs at host time 1000.0
    a = dev.stamp()
    fake.now = 255.0  # 250 ms of queued work later
    b = dev.stamp()
    assert [dev.seconds(x) for x in (a, b)] == [1000.0, 1000.25]
    assert fake.calls[:2] == ["synchronize", "record"] and "event.synchronize" in fake.calls


def test_cuda_peak_memory_is_the_allocators_since_a_reset():
    fake = FakeCuda()
    dev = CudaDevice(0, cuda=fake)
    with dev.peak_memory() as reading:
        fake.allocated, fake.peak = 300, 900  # a step's tensors come and go
        fake.allocated = 120
    assert (reading.start, reading.peak) == (100, 900)
    assert fake.calls.index("reset_peak") < len(fake.calls) - 1 and fake.calls[-1] == "synchronize"


def test_cuda_waits_and_completions_go_through_streams():
    """host_wait: the collective's stream wait, then the stream synchronized (a CUDA Work.wait() alone returns at
    once); on_complete: the completion is an event recorded on a timing stream made to wait for the work."""
    fake = FakeCuda()
    dev = CudaDevice(0, cuda=fake)
    order = []

    class Work:
        def wait(self):
            order.append("wait")

    dev.host_wait(Work())
    assert order == ["wait"] and fake.calls[-1] == "stream.synchronize"
    got = []
    fake.now = 7.0
    dev.on_complete(Work(), got.append, "pull")
    assert order == ["wait", "wait"] and got[0].t == 7.0 and "stream" in fake.calls


def test_batches_go_to_a_gpu_pinned_and_non_blocking():
    dev = CudaDevice(0, cuda=FakeCuda())
    seen = []

    class Host:
        def pin_memory(self):
            seen.append("pin")
            return self

        def to(self, device, non_blocking=False):
            seen.append((str(device), non_blocking))
            return "on device"

    assert dev.to_device(Host()) == "on device" and seen == ["pin", ("cuda:0", True)]


def test_defaults_per_device():
    assert devices.default_dtype(CudaDevice(0, cuda=FakeCuda())) == "bf16"
    assert devices.default_dtype(Device()) == "fp32"
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        CudaDevice(3, cuda=(fake := FakeCuda())).configure()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and "set_device 3" in fake.calls
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_link_clock_reads_the_device_not_the_host():
    """Busy, exposed and peer-wait seconds come from the device's stamps once resolved (on a GPU, events; a
    host clock would see an NCCL exchange complete when it was queued)."""

    class Stamps(Device):
        def __init__(self):
            super().__init__()
            self.now = 0.0

        def stamp(self):
            return self.now

        def on_complete(self, work, done, name):
            work.append(done)

        def seconds(self, stamp):
            return 100.0 + stamp

    dev = Stamps()
    clock = LinkClock(dev)
    completions = []
    clock.track(completions, "pull", 0)  # posted at 0
    dev.now = 3.0
    clock.waits.append(("pull", 0, 1.0, 3.0))  # compute waited from 1 to 3
    completions[0](2.5)  # the device finished the exchange at 2.5
    clock.resolve()
    assert clock.busy_s("pull") == pytest.approx(2.5)
    exposed, peer = clock.split_waits({("pull", 0): 101.5})  # the last rank posted at 1.5
    assert (exposed, peer) == pytest.approx((1.5, 0.5))


class StreamLog(Device):
    """CPU semantics, every stream operation the LNK streams ask for logged with the thread that asked."""

    def __init__(self):
        super().__init__()
        self.log: list[tuple[str, object]] = []
        self._n = 0

    def side_stream(self, name):
        self.log.append(("side_stream", name))
        return contextlib.nullcontext()

    def event(self):
        self._n += 1
        self.log.append(("event", self._n))
        return self._n

    def wait_for(self, marker):
        self.log.append(("wait_for", marker))

    def record_stream(self, tensor):
        self.log.append(("record_stream", tensor.numel()))


def test_lnk_streams_order_their_streams_as_cuda_needs():
    """Pull: the helper stream first waits for the compute stream's queue (the step's master weights), every group
    the compute thread takes is waited for on its stream (the marker made after unpacking) and the buffer is
    recorded there; push: a group's gradients are read only after the marker of their accumulation."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        numels, sharded = np.array([6, 8, 4], dtype=np.int64), np.array([True, True, False])
        link = plan_link(numels, sharded, [Role((0, 1, 2))], 0, (0, 1, 2))
        shard = torch.arange(18.0, dtype=torch.float64)
        dev = StreamLog()
        pull = PullStream(link, shard, torch.float64, None, True, LinkClock(dev))
        got = {}
        pull.on_arrival = lambda g, buf: got.__setitem__(g, buf.clone())
        pull.start()
        for g in range(3):
            pull.wait(g)
        pull.finish()
        assert torch.cat([got[g] for g in range(3)]).tolist() == shard.tolist()
        start = dev.log.index(("side_stream", "pull"))
        assert dev.log[start - 1][0] == "event" and dev.log[start + 1] == ("wait_for", dev.log[start - 1][1])
        waited = [m for k, m in dev.log if k == "wait_for"][1:]
        assert len(waited) == 3 and all(m is not None for m in waited)
        assert [k for k, _ in dev.log].count("record_stream") == 3
        dev.log.clear()
        push = PushStream(link, torch.ones(18, dtype=torch.float64), torch.float64, None, True, LinkClock(dev))
        for g in (2, 1, 0):
            push.ready(g)
        assert push.finish().tolist() == [1.0] * 18
        ready_markers = [m for k, m in dev.log if k == "event"][1:4]  # after the helper's start marker
        waits = [m for k, m in dev.log if k == "wait_for"]
        assert all(m in waits for m in ready_markers)
    finally:
        dist.destroy_process_group()


def _plan(lengths: list[list[int]]) -> Plan:
    batch, mbs, sid = [], [], 0
    for mb in lengths:
        mbs.append(MicroBatch(seqs=list(range(sid, sid + len(mb)))))
        batch += [BatchSeq(id=sid + i, length=n) for i, n in enumerate(mb)]
        sid += len(mb)
    return Plan(iteration=0, profile="p", gpus=1, batch=batch, strategy="S", estimate=Estimate(propagation_s=0.0),
                pipelines=[PlanPipeline(tp=1, pp=1, cp=1, ranks=[0], micro_batches=mbs, estimate_s=0.0)])


def test_fp64_verify_on_cuda_is_refused_when_the_math_backend_cannot_hold_the_scores():
    """32 heads, one 32K document: 3 x 32 x 32768^2 x 8 bytes = 768 GiB of fp64 scores, on an 80 GiB device."""
    capacity = 80 * 2**30
    why = fp64_attention_refusal([("run/iter_000003.json", _plan([[1000, 32768]]))], 32, capacity)
    assert why.startswith("run/iter_000003.json: field pipelines.0.micro_batches.0: 1 document(s) of 32768 tokens")
    assert "768.0 GiB" in why and "on CPU" in why
    # four equal 2K documents are batched into one [4, 32, 2048, 2048] call: 12 GiB, fine on 80 GiB
    assert fp64_attention_refusal([("a", _plan([[2048] * 4, [512]]))], 32, capacity) is None


class StreamOwners(Device):
    """CPU semantics with a current stream per thread ("compute" unless inside `side_stream`); logs the stream
    each exchange was posted on and each `record_stream` (tensors kept, so their storages stay distinct)."""

    def __init__(self):
        super().__init__()
        self.local = __import__("threading").local()
        self.posted: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.recorded: list[tuple[str, torch.Tensor]] = []

    def stream(self) -> str:
        return getattr(self.local, "stream", "compute")

    @contextlib.contextmanager
    def side_stream(self, name):
        self.local.stream = name
        try:
            yield
        finally:
            self.local.stream = "compute"

    def record_stream(self, tensor):
        self.recorded.append((self.stream(), tensor))


def test_push_buffers_posted_by_the_backward_are_recorded_on_the_stream_that_sums_them(monkeypatch):
    """A push group posted from the compute thread (the backward) allocates its buffers on the compute stream; the
    helper's stream reads the receive buffer and drops both, so both are recorded on it: else the compute stream
    could reuse their memory while the helper still sums it (and NCCL still sends)."""
    from hydraplan.runtime import lnk_streams

    dev = StreamOwners()
    a2a = lnk_streams.dist.all_to_all_single

    def logged(out, inp, *args, **kw):
        dev.posted.append((dev.stream(), out, inp))
        return a2a(out, inp, *args, **kw)

    monkeypatch.setattr(lnk_streams.dist, "all_to_all_single", logged)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        numels, sharded = np.array([6, 8, 4], dtype=np.int64), np.array([True, True, False])
        link = plan_link(numels, sharded, [Role((0, 1, 2))], 0, (0, 1, 2))
        push = PushStream(link, torch.ones(18, dtype=torch.float64), torch.float32, None, True, LinkClock(dev),
                          master_dtype=torch.float64)
        for g in (2, 1, 0):
            push.ready(g)  # the backward's call: posts from the compute thread while the window has room
        assert push.finish().tolist() == [1.0] * 18
        by_compute = [(o, i) for s, o, i in dev.posted if s == "compute"]
        assert by_compute, "no group was posted from the compute thread"
        on_push = {t.untyped_storage().data_ptr() for s, t in dev.recorded if s == "push"}
        for out, inp in by_compute:
            assert out.untyped_storage().data_ptr() in on_push and inp.untyped_storage().data_ptr() in on_push
        assert all(s == "push" for s, _ in dev.recorded)
    finally:
        dist.destroy_process_group()
