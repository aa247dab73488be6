"""The end-to-end sync term (docs/formats.md): hand-computed cases of bandwidth, transfer and exposure."""

import pytest
from helpers import tiny_profile

from hydraplan.core.cluster import Cluster
from hydraplan.core.sync import exposed_s
from hydraplan.store.profiles import load_profile

BW64 = 1 / (0.125 / 370 + 0.875 / 45)  # ~50.55 GB/s


def test_bandwidth_mixes_intra_and_inter_node_harmonically():
    p = load_profile("h100-llama2-7b")  # 370 GB/s NVLink, 45 GB/s IB per GPU, 8 GPUs per node
    assert (p.network.intra_node_GBps, p.network.inter_node_GBps) == (370.0, 45.0)
    # 64 GPUs: 1/8 of the owners share the node -> 1 / (0.125/370 + 0.875/45)
    assert Cluster.of(p, 64).bandwidth_GBps == pytest.approx(BW64, rel=1e-12)
    assert Cluster.of(p, 8).bandwidth_GBps == pytest.approx(370.0)  # one node: NVLink only
    assert Cluster.of(p, 4).bandwidth_GBps == pytest.approx(370.0)  # G = min(gpus_per_node, N)


def test_transfer_is_the_stage_slice_over_bandwidth():
    p = load_profile("h100-llama2-7b")
    phi = p.model.params
    assert Cluster.of(p, 64).transfer_s(1, 1) == pytest.approx(2 * phi / (BW64 * 1e9))
    assert Cluster.of(p, 64).transfer_s(2, 4) == pytest.approx(2 * phi / 8 / (BW64 * 1e9))
    assert Cluster.of(p, 64).transfer_s(8, 1) == pytest.approx(Cluster.of(p, 64).transfer_s(2, 4))  # cp does not divide the slice


def test_exposure_hides_pull_behind_forward_and_push_behind_backward():
    assert exposed_s(0.3, 0.6) == pytest.approx(0.1)  # pull 0.3 - 0.2 forward; push 0.3 < 0.4 backward
    assert exposed_s(0.3, 0.3) == pytest.approx(0.2 + 0.1)
    assert exposed_s(0.1, 0.9) == 0.0
    assert exposed_s(5.0, 0.0) == 0.0  # an idle pipeline pulls and pushes nothing


def test_iteration_estimate_takes_the_slowest_pipeline_end_to_end():
    p = load_profile("h100-llama2-7b")
    t11 = 2 * p.model.params / (BW64 * 1e9)  # ~0.2666 s per direction
    keys = [(8, 1, 1), (1, 1, 1), (1, 1, 1)]
    est = Cluster.of(p, 64).estimate(keys, [0.40, 0.35, 0.0])
    one = 2 * t11 - 0.35  # both directions exposed past a third and two thirds of 0.35
    assert est.exposed_s[2] == 0.0
    assert est.exposed_s[1] == pytest.approx(max(0, t11 - 0.35 / 3) + max(0, t11 - 0.7 / 3))
    assert est.iteration_s == pytest.approx(max(0.40 + est.exposed_s[0], 0.35 + one))
    assert est.sync_s == pytest.approx(est.exposed_s[1])


def test_tie_goes_to_the_first_pipeline_and_no_model_means_no_sync():
    p = load_profile("h100-llama2-7b")
    est = Cluster.of(p, 64).estimate([(2, 1, 1), (1, 2, 1)], [0.5, 0.5])  # same slice, same time
    assert est.sync_s == est.exposed_s[0]
    bare = tiny_profile()  # no model.params / network: the propagation estimate alone
    assert Cluster.of(bare, 4).estimate([(1, 1, 1)], [0.2]) == (0.2, 0.0, [0.0])
