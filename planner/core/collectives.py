"""NCCL's collectives and point-to-point sends on one GPU type's fabrics: what the analytic profiles charge for TP's
all-gathers and reduce-scatters, CP's ring steps and PP's sends, and what the fidelity bench predicts for nccl-tests'
published bus bandwidths.

A collective of `size` bytes (nccl-tests' size: the buffer of all-reduce, the whole gathered output of all-gather,
the whole input of reduce-scatter and all-to-all) on n GPUs moves size * factor bytes per GPU, factor = busbw /
algbw (2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for a send). NCCL runs it
with the protocol (LL, LL128, Simple) that finishes first:

    t = min over protocols (latency + hops * hop_s + size * factor / bandwidth)

on the node's fabric (NVLink) while the group fits in a node, on the network's once it spans nodes. The algorithm
sets the hops and the bandwidth (hardware.Fabric holds the constants, fitted to nccl-tests' measurements):
- all-reduce inside a Hopper node runs NVLS (the switch reduces): no hops, and a fixed algorithm bandwidth, so its
  bus bandwidth grows with 2(n-1)/n as the protocol's does at the fabric's measured size; across nodes it is
  hierarchical: NVLS inside each node and a tree over the k nodes (2 log2(k) hops), the node's NICs carrying
  2(k-1)/k of its share;
- all-gather and reduce-scatter run a ring: n-1 hops, at most the node's ring bandwidth, across nodes the node's NICs
  carrying (k-1)/k of its share;
- all-to-all: n-1 hops; across nodes the (n-g)/n of each GPU's data bound for other nodes leaves through its own NIC;
- a send: one hop at the link's bandwidth (NVLink's usable share, or the GPU's NIC).
"""

from __future__ import annotations

import math

from hydraplan.core.hardware import Fabric, GPUSpec, Protocol

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw: the bytes one GPU moves per byte of the operation's size."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op == "sendrecv":
        return 1.0
    raise ValueError(f"unknown collective {op!r} (one of {', '.join(OPS)})")


def fabric_of(gpu: GPUSpec, n: int, gpus_per_node: int) -> Fabric:
    """The node's fabric while n GPUs fit in a node, else the network's."""
    return gpu.node_fabric if n <= gpus_per_node else gpu.net_fabric


def hops(op: str, n: int, gpus_per_node: int) -> float:
    """Dependent hops of the algorithm NCCL runs: none for NVLS inside a node; across nodes a hierarchical all-reduce
    (NVLS inside each node, a tree over the nodes: 2 log2(nodes) hops); a ring's n-1 for the other collectives; one
    hop for a send."""
    if op == "sendrecv":
        return 1.0
    if op != "all_reduce":
        return n - 1.0
    return 0.0 if n <= gpus_per_node else 2 * math.log2(math.ceil(n / gpus_per_node))


def bandwidth_GBps(fabric: Fabric, node: Fabric, p: Protocol, op: str, n: int, gpus_per_node: int) -> float:
    """The bus bandwidth `op` reaches with protocol p. Inside a node: all-reduce's NVLS with a fixed algorithm
    bandwidth (its bus bandwidth follows 2(n-1)/n from the fabric's measured size), the ring's for the others.
    Across nodes the data a node sends leaves through its gpus_per_node NICs: a hierarchical all-reduce moves
    2(k-1)/k of a node's share over k nodes, a ring (k-1)/k of it for all-gather and reduce-scatter, each at most
    what the node's NVLink carries; an all-to-all sends the (n-g)/n bound for other nodes through each
    GPU's own NIC."""
    if n <= gpus_per_node:
        if op == "all_reduce":
            return p.busbw_GBps * bus_factor(op, n) / bus_factor(op, fabric.gpus)
        return fabric.nic_GBps if op == "sendrecv" else min(p.busbw_GBps, fabric.ring_GBps)
    if op == "sendrecv":
        return fabric.nic_GBps
    local = min(n, gpus_per_node)
    if op == "alltoall":  # many peers at once: the fabric's all-to-all rate per NIC
        return min(p.busbw_GBps, (fabric.alltoall_GBps or fabric.nic_GBps) * (n - 1) / (n - local))
    k = math.ceil(n / gpus_per_node)
    node_bw = node.protocols[-1].busbw_GBps if op == "all_reduce" else node.ring_GBps
    over_nodes = local * fabric.nic_GBps * bus_factor(op, n) / bus_factor(op, k)
    return min(p.busbw_GBps, node_bw, over_nodes)


def collective_s(gpu: GPUSpec, op: str, n: int, gpus_per_node: int, size: float, fabric: Fabric | None = None) -> float:
    """Seconds of one `op` of `size` bytes (nccl-tests' size) on n GPUs (0 for a group of one), on `fabric` if given
    (a named fabric: a node's or across nodes), else the GPU's node or network fabric: the fastest protocol."""
    if n <= 1 and op != "sendrecv":
        return 0.0
    fab = fabric or fabric_of(gpu, n, gpus_per_node)
    node = fab if n <= gpus_per_node else gpu.node_fabric
    moved = size * bus_factor(op, n)
    hop = hops(op, n, gpus_per_node) * fab.hop_s
    return min(p.latency_s + hop + moved / (bandwidth_GBps(fab, node, p, op, n, gpus_per_node) * 1e9)
               for p in fab.protocols)


def bus_bandwidth_GBps(gpu: GPUSpec, op: str, n: int, gpus_per_node: int, size: float,
                       fabric: Fabric | None = None) -> float:
    """nccl-tests' busbw (GB/s) of `op` at `size` bytes on n GPUs."""
    return size * bus_factor(op, n) / collective_s(gpu, op, n, gpus_per_node, size, fabric) / 1e9


def latency_s(gpu: GPUSpec, n: int, gpus_per_node: int) -> float:
    """A ring all-gather's size-independent cost on n GPUs: the fastest protocol's latency and the ring's hops."""
    return collective_s(gpu, "all_gather", n, gpus_per_node, 0.0)


def ring_bytes_s(gpu: GPUSpec, n: int, gpus_per_node: int) -> float:
    """The bus bandwidth (bytes/s) a large all-gather or reduce-scatter reaches on n GPUs."""
    fab = fabric_of(gpu, n, gpus_per_node)
    return max(bandwidth_GBps(fab, gpu.node_fabric, p, "all_gather", n, gpus_per_node) for p in fab.protocols) * 1e9


def group_bus_bytes_s(gpu: GPUSpec, n: int, local: int, gpus_per_node: int) -> float:
    """The bus bandwidth (bytes/s) a large ring collective of n GPUs, `local` of them per node, reaches: the node
    fabric's inside a node; across nodes the network's ring, whose rings run through the group's own NICs (local of
    the node's gpus_per_node), at most the node's."""
    node = ring_bytes_s(gpu, min(n, gpus_per_node), gpus_per_node)
    if n <= local:
        return node
    return min(node, ring_bytes_s(gpu, gpus_per_node + 1, gpus_per_node) * local / gpus_per_node)


def nvlink_bytes_s(gpu: GPUSpec) -> float:
    """Usable bytes/s of one NVLink direction: a send to a peer in the node."""
    return gpu.node_fabric.nic_GBps * 1e9


def nic_bytes_s(gpu: GPUSpec) -> float:
    """Usable bytes/s of one NIC direction (one NIC per GPU): a send across nodes."""
    return gpu.net_fabric.nic_GBps * 1e9


def p2p(gpu: GPUSpec, crosses_nodes: bool) -> tuple[float, float]:
    """(bytes/s, latency s) of a send to one peer: NVLink inside a node, the GPU's NIC across nodes."""
    fab = gpu.net_fabric if crosses_nodes else gpu.node_fabric
    return fab.nic_GBps * 1e9, min(p.latency_s for p in fab.protocols) + fab.hop_s
