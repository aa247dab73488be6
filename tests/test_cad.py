"""Core-attention disaggregation planner (hydraplan.solve.cad): costs, bytes, layout, and the assignment against
brute force on small cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hydraplan.core.cluster import Cluster
from hydraplan.schema import Network, Scheme, TimeCoeffs
from hydraplan.solve import cad
from hydraplan.store.datasets import load_dataset
from hydraplan.store.profiles import load_profile


def _profile(gpn: int = 8):
    p = load_profile("h100-llama2-7b")
    return p.model_copy(update={"gpu": p.gpu.model_copy(update={"gpus_per_node": gpn}),
                                "network": Network(intra_node_GBps=100.0, inter_node_GBps=25.0)})


def _scheme(a=1e-9, b=1e-5, c=1e-3, tp=1, pp=1, max_len=1 << 20) -> Scheme:
    return Scheme(tp=tp, pp=pp, cp=1, max_len=max_len, util_len=1, time=TimeCoeffs(a=a, b=b, c=c))


def test_tasks_of_a_document_add_up_to_its_attention_term():
    s = _scheme()
    cuts = [0, 100, 1000, 1500, 4096]
    parts = sum(cad.task_cost(s, lo, hi) for lo, hi in zip(cuts, cuts[1:]))
    assert parts == pytest.approx(s.time.a * 4096**2, rel=1e-12)


def test_cut_step_balances_tokens_and_covers_documents():
    lengths = np.array([5000, 300, 1200, 77, 9000])
    pieces = cad.cut_step(lengths, [4, 0, 2, 1, 3], 4)
    tokens = np.zeros(4)
    per_doc = {}
    for doc, s, e, r in pieces:
        tokens[r] += e - s
        per_doc.setdefault(doc, []).append((s, e))
    assert tokens.max() - tokens.min() <= 1
    for doc, ranges in per_doc.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == lengths[doc]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_task_comm_bytes_by_hand():
    """Doc of 4000 tokens: [0,1000) on rank 0, [1000,4000) on rank 1. Task [2000,4000) (home 1) run on rank 0
    (its own 1000 prefix tokens stay local): rank 1 sends Q (2*2000 q incl. dQ back) and K,V of its 3000
    prefix tokens (2*3000*q each way); both directions carry the same bytes."""
    p = _profile()
    s = _scheme(tp=2)
    cm = cad.comm_model(p, s, 2)
    q = 2 * p.model.hidden / 2
    pieces = [(0, 0, 1000, 0), (0, 1000, 4000, 1)]
    kv = cad.prefix_tokens(pieces, 0, 4000, 2)
    assert kv.tolist() == [1000, 3000]
    C = cad.task_comm(cm, kv, 2000, home=1)
    want = (2 * 2000 + 2 * 3000) * q * p.model.layers / 100e9  # both replicas (2 GPUs each) in one node
    assert C[0, 0] == pytest.approx(want) and C[0, 1] == pytest.approx(want)
    # at home it still needs the K/V of rank 0's 1000 tokens
    want_home = 2 * 1000 * q * p.model.layers / 100e9
    assert C[1, 1] == pytest.approx(want_home) and C[1, 0] == pytest.approx(want_home)


def test_comm_model_crosses_nodes_between_large_replicas():
    p = _profile(gpn=8)
    cm = cad.comm_model(p, _scheme(tp=8), 3)
    assert cm.bw[0, 1] == 25e9 and cm.bw[1, 2] == 25e9
    cm = cad.comm_model(p, _scheme(tp=4), 3)
    assert cm.bw[0, 1] == 100e9 and cm.bw[1, 2] == 25e9


def _brute(problem: cad.StepProblem, budget_s: float) -> float:
    best = np.inf
    for ranks in itertools.product(range(problem.d), repeat=len(problem.tasks)):
        comp, comm = problem.loads(ranks)
        if comm.max() > budget_s + 1e-15:
            continue
        best = min(best, cad.step_time(comp, comm))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_milp_assignment_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    p = _profile(gpn=2)
    s = _scheme(a=rng.uniform(1e-10, 5e-9), b=rng.uniform(1e-6, 2e-5), c=1e-4)
    lengths = rng.integers(200, 6000, size=rng.integers(2, 5))
    prob = cad.step_problem(s, cad.comm_model(p, s, 3), lengths, list(range(lengths.size)), 3, chunk=10**9)
    if len(prob.tasks) > 7:
        prob = cad.step_problem(s, cad.comm_model(p, s, 3), lengths[:2], [0, 1], 3, chunk=10**9)
    home = [t[3] for t in prob.tasks]
    budget = float(np.inf) if seed % 2 else float(prob.loads(home)[0].mean())
    out = cad.milp(prob, budget, home)
    assert out is not None
    ranks, optimal = out
    assert optimal
    comp, comm = prob.loads(ranks)
    cap = max(budget, float(prob.loads(home)[1].max()))  # the budget never rules out the start
    assert comm.max() <= cap * (1 + 1e-9)
    assert cad.step_time(comp, comm) == pytest.approx(_brute(prob, cap), rel=1e-6)
    g = cad.greedy(cad.step_problem(s, prob.cm, lengths, list(range(lengths.size)), 3, chunk=10**9), budget)
    assert len(g) >= len(prob.tasks)  # greedy may cut tasks, never drops one


def test_greedy_balances_a_skewed_step_and_never_worsens_it():
    p = _profile()
    s = _scheme(a=2e-9, b=1e-5, c=1e-3)
    lengths = np.array([32768, 512, 512, 1024, 2048, 700, 300, 4000])
    prob = cad.step_problem(s, cad.comm_model(p, s, 4), lengths, list(range(8)), 4)
    before = cad.step_time(*prob.loads([t[3] for t in prob.tasks]))
    ranks = cad.greedy(prob, np.inf)
    comp, comm = prob.loads(ranks)
    assert cad.step_time(comp, comm) < 0.8 * before
    att = comp - prob.linear
    assert att.max() / att.mean() - 1 < 0.1
    # the tasks still partition every document's queries
    cover = {}
    for doc, a, b, _ in prob.tasks:
        cover.setdefault(doc, []).append((a, b))
    for doc, r in cover.items():
        r.sort()
        assert r[0][0] == 0 and r[-1][1] == lengths[doc] and all(x[1] == y[0] for x, y in zip(r, r[1:]))


def test_plan_cad_estimate_recomputes_from_the_section():
    prof = load_profile("h100-llama2-7b")
    cluster = Cluster.of(prof, 64)
    view = cluster.view
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(8.5, 1.3, size=60).astype(np.int64) + 1, 32768)
    r = cad.best_cad(cluster, lengths)
    assert r is not None
    scheme = view.scheme(r.section.tp, r.section.pp, 1)
    assert max(max(t) for t in r.per_rank_tokens) <= scheme.max_len  # MaxLen holds on the replicas' pieces
    by_seq = {i: int(l) for i, l in enumerate(lengths)}
    est, problems = cad.estimate(view, r.section, by_seq)
    assert problems == []
    assert est == pytest.approx(r.estimate_s, rel=1e-12)
    assert est >= cad.ideal_bound(view.scheme(r.section.tp, r.section.pp, 1), 64, lengths, len(r.section.steps)) * (1 - 1e-12)
    # a corrupted section is caught
    bad = r.section.model_copy(deep=True)
    bad.steps[0].tasks.pop()
    assert cad.estimate(view, bad, by_seq)[1]


def test_pack_cad_plans_validate_and_tampering_is_caught(tmp_path):
    import json

    from helpers import hp

    from hydraplan.schema import Plan, Summary

    out = tmp_path / "run"
    r = hp("pack", "--profile", "h100-llama2-13b", "--dataset", "builtin:prolong", "--gpus", "64", "--context-len", "32768",
           "--tokens-per-iter", "200000", "--iterations", "2", "--out", out, "--workers", "1", "--cad")
    assert r.returncode == 0, r.stderr
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    assert summary.args.cad
    for it in summary.iterations:
        assert "cad" in it.candidates_s  # the default objective is end to end: the lowest iteration_s wins
        assert it.iteration_s == min(c.iteration_s for c in it.candidates if c.iteration_s is not None)
    cad_iters = [it.iteration for it in summary.iterations if it.strategy == "cad"]
    assert cad_iters  # on prolong at 32K the CAD plan wins for the 13B on 64 GPUs
    v = hp("validate", out, "--profile", "h100-llama2-13b", "--json")
    assert v.returncode == 0, v.stdout
    assert json.loads(v.stdout)["plans"] == 2
    path = out / f"iter_{cad_iters[0]:06d}.json"
    plan = Plan.model_validate_json(path.read_text())
    assert plan.cad is not None and plan.estimate.iteration_s is not None
    task = plan.cad.steps[0].tasks[0]
    task.rank = (task.rank + 1) % plan.cad.replicas  # the recorded estimate no longer recomputes
    path.write_text(plan.model_dump_json(by_alias=True))
    v = hp("validate", out, "--profile", "h100-llama2-13b")
    assert v.returncode != 0 and "CAD estimate" in v.stdout + v.stderr


def test_milp_refinement_is_bounded_by_nodes_not_by_the_clock(monkeypatch):
    """The plan may not depend on how fast the machine is: the MILP runs with no time limit, a node limit
    instead, and two runs give the same answer."""
    import highspy

    from hydraplan.solve import milp
    from hydraplan.solve.cad import balance_milp

    rng = np.random.default_rng(3)
    p = _profile(gpn=2)
    s = _scheme(a=2e-9, b=1e-5, c=1e-4)
    lengths = rng.integers(500, 9000, size=6)
    prob = cad.step_problem(s, cad.comm_model(p, s, 3), lengths, list(range(lengths.size)), 3)
    home = [t[3] for t in prob.tasks]
    seen: list[highspy.Highs] = []
    run = milp.run_mip
    monkeypatch.setattr(milp, "run_mip", lambda h: seen.append(h) or run(h))
    first = cad.milp(prob, float("inf"), home)
    (h,) = seen
    assert h.getOptionValue("time_limit")[1] == float("inf")
    assert h.getOptionValue("mip_max_nodes")[1] == balance_milp.MILP_MAX_NODES
    assert cad.milp(prob, float("inf"), home) == first


@pytest.mark.parametrize("objective", ["end-to-end", "propagation"])
def test_best_cad_is_the_best_plan_in_the_objective_over_every_option(objective):
    """With every (scheme, steps) option planned, best_cad keeps the one with the lowest score in the cluster's
    objective: end to end a narrow scheme's exposed parameter pull and push counts, as compare and pack score it."""
    cluster = Cluster.of(load_profile("h100-llama2-7b"), 64, objective)
    docs = np.minimum(load_dataset("builtin:wikipedia").lengths, 32768)  # compare's batches: 200K tokens, 32K context
    docs = docs[np.random.default_rng(1).permutation(docs.size)[:2000]]
    lengths = docs[:int(np.searchsorted(np.cumsum(docs), 200_000))]
    total = int(lengths.sum())
    scores = []
    for s in cluster.schemes:
        if s.cp != 1 or cluster.gpus // s.gpus < 1:
            continue
        vmin = max(1, -(-total // (cluster.gpus // s.gpus * s.max_len)))
        for v in range(vmin, vmin + 3):
            r = cad.plan_cad(cluster, s, lengths, v, exact=False)
            if r is not None:
                it = cluster.estimate([s.key], [r.estimate_s]).iteration_s
                scores.append((cluster.score(r.estimate_s, it), r.estimate_s, it))
    best = cad.best_cad(cluster, lengths, top=len(scores) + 1, exact=False)
    assert best is not None
    key = (best.section.tp, best.section.pp, 1, best.section.recompute)
    it = cluster.estimate([key], [best.estimate_s]).iteration_s
    assert cluster.score(best.estimate_s, it) == pytest.approx(min(s for s, _, _ in scores), rel=1e-12)
    if objective == "end-to-end":  # the case this guards: the fastest propagation is not the fastest iteration
        fastest_prop = min(scores, key=lambda x: x[1])
        assert fastest_prop[2] > min(s for s, _, _ in scores) * (1 + 1e-6)
