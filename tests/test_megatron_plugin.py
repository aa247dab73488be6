"""hydraplan inside a Megatron training job (hydraplan.integrations.megatron): `install` on the three Megatrons
(stand-ins of their data_schedule, tests/megatron_standins.py) wires exactly the seams each has and uses and says
so in one line; the drop-ins take every constructor argument Megatron passes and honour max_num_seqs; a setting
hydraplan cannot price, or a batch it cannot schedule, goes to Megatron's own scheduler with one line; the
schedule comparison across ranks; importing the plugin stays light; the example's launch."""

from __future__ import annotations

import json
import subprocess
import sys

import megatron_standins as mg
import numpy as np
import pytest
from helpers import free_port, init_gloo
from ranks import spawn

from hydraplan.core.errors import UserError
from hydraplan.core.executors import HybridCP, hybrid_cp_violations, packing_violations
from hydraplan.integrations import megatron as integ
from hydraplan.integrations.megatron.guard import Guard, digest

PROFILE = "h100-llama2-7b"


def lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if l]


def one_line(text: str, *words: str) -> str:
    """The only line of `text`: hydraplan's, containing every word."""
    (line,) = lines(text)
    assert line.startswith("hydraplan: ") and all(w in line for w in words), line
    return line


def short_docs(n: int = 120, seed: int = 0) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(64, 900, n)]


def pairs(lengths: list[int], first: int = 0) -> list[tuple[int, int]]:
    return [(first + i, l) for i, l in enumerate(lengths)]


# ------------------------------------------------------------------------------------------- import
def test_import_loads_neither_megatron_nor_the_planners_heavy_libraries():
    """A training process pays for the planner only at the first schedule: importing the plugin loads no
    Megatron, torch, solver, dataframe, plotting, numba or pydantic (all were, 0.5-1.1 s warm)."""
    code = ("import sys, json, hydraplan.integrations.megatron; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                           text=True).stdout))
    heavy = {"megatron", "torch", "ortools", "highspy", "pandas", "pyarrow", "matplotlib", "numba", "pydantic", "scipy"}
    assert not loaded & heavy, loaded & heavy


# ------------------------------------------------------------------------------------------- install
def test_install_on_a_release_wires_hybrid_cp_only_and_says_so(monkeypatch, capsys):
    ds = mg.put(monkeypatch, mg.release())
    uninstall = integ.install(PROFILE)
    out, err = capsys.readouterr()
    one_line(out, PROFILE, "hybrid CP's BalancedCPScheduler")
    assert err == ""  # packing and dynamic CP were not asked for: their absence is no warning
    assert issubclass(ds.BalancedCPScheduler, mg.BalancedCPScheduler)
    uninstall()
    assert ds.BalancedCPScheduler is mg.BalancedCPScheduler


def test_install_warns_in_one_line_of_a_seam_asked_for_that_this_megatron_lacks(monkeypatch, capsys):
    ds = mg.put(monkeypatch, mg.release())
    integ.install(PROFILE, seams=("packing",))
    out, err = capsys.readouterr()
    one_line(err, "dp_balanced not installed", "scheduler_map")
    assert out == ""
    assert ds.BalancedCPScheduler is mg.BalancedCPScheduler  # only what was asked for


def test_install_on_dev_puts_both_drop_ins_in_leaves_dead_hybrid_cp_alone_and_uninstalls(monkeypatch, capsys):
    """dev deprecates --hybrid-context-parallel into dynamic CP: nothing builds HybridCPDataLoaderWrapper there, so
    hybrid CP is left alone (and said so), dp_balanced and default_dynamic_cp are replaced."""
    ds = mg.put(monkeypatch, mg.dev())
    uninstall = integ.install(PROFILE)
    out, err = capsys.readouterr()
    one_line(out, "dp_balanced and default_dynamic_cp", "left alone", "--hybrid-context-parallel", "dynamic CP")
    assert err == ""
    assert ds.BalancedCPScheduler is mg.BalancedCPScheduler
    assert issubclass(ds.scheduler_map["dp_balanced"], mg.DevDpBalanced)
    assert issubclass(ds.scheduler_map["default_dynamic_cp"], mg.DevDefaultDynamicCP)
    integ.install(PROFILE)  # twice: the second replaces Megatron's classes again, not the first drop-ins
    assert ds.scheduler_map["dp_balanced"].hydraplan_base is mg.DevDpBalanced
    uninstall()
    assert ds.scheduler_map == {"dp_balanced": mg.DevDpBalanced, "default_dynamic_cp": mg.DevDefaultDynamicCP}
    capsys.readouterr()
    integ.install(PROFILE, seams=("hybrid_cp",))
    one_line(capsys.readouterr().err, "installed but never used", "HybridCPDataLoaderWrapper")


def test_install_on_main_replaces_the_enum_keyed_entry(monkeypatch, capsys):
    ds = mg.put(monkeypatch, mg.main())
    uninstall = integ.install(PROFILE)
    one_line(capsys.readouterr().out, "hybrid CP's BalancedCPScheduler and dp_balanced")
    assert issubclass(ds.scheduler_map[mg.PackingSchedulerEnum.DP_BALANCED], mg.MainDpBalanced)
    lengths = short_docs()
    cfg = mg.config(sequence_packing_scheduler="dp_balanced", max_seqlen_per_dp_cp_rank=4096, tensor_model_parallel_size=2)
    groups, *_ = ds.wrap_data_iterator(pairs(lengths), cfg, 8, dp=2, cp=2)  # main passes four constructor arguments
    assert groups == integ.schedule_packing(lengths, profile=PROFILE, tp=2, pp=1, cp=2, dp=2, capacity=8192)
    uninstall()
    assert ds.scheduler_map[mg.PackingSchedulerEnum.DP_BALANCED] is mg.MainDpBalanced


def test_install_without_megatron_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron", None)  # import megatron fails as where it is not installed
    monkeypatch.delitem(sys.modules, mg.MODULE, raising=False)
    with pytest.raises(UserError) as e:
        integ.install(PROFILE)
    assert "\n" not in str(e.value) and "sys.path" in str(e.value)


def test_hybrid_cp_drop_in_forwards_every_constructor_argument(monkeypatch):
    """A Megatron whose BalancedCPScheduler takes one more argument (as dev's packing schedulers took
    max_num_seqs): the drop-in passes it through and schedules as before."""

    class Later(mg.BalancedCPScheduler):
        def __init__(self, max_seq_len_per_rank, dp_cp_group, *, balance="l2"):
            super().__init__(max_seq_len_per_rank, dp_cp_group)
            self.balance = balance

    ds = mg.put(monkeypatch, mg.release())
    ds.BalancedCPScheduler = Later
    integ.install(PROFILE)
    sched = ds.BalancedCPScheduler(max_seq_len_per_rank=8000, dp_cp_group=mg.Group(8), balance="linear")
    lengths = short_docs(50)
    _, ids = sched.get_groups_and_subsamples(pairs(lengths), mg.config(tensor_model_parallel_size=2))
    assert sched.balance == "linear"
    assert ids == integ.schedule_hybrid_cp(lengths, profile=PROFILE, tp=2, dpcp=8, max_seqlen_per_rank=8000)


# ----------------------------------------------------------------------------------- dev's constructor arguments
def test_packing_drop_in_honours_max_num_seqs_as_dev_calls_it(monkeypatch, capsys):
    """dev builds dp_balanced with max_num_seqs from --thd-max-packed-sequences and asserts no pack holds more:
    hydraplan's packs keep to it (they packed 30 documents under a cap of 8 before)."""
    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    lengths = short_docs(160)
    cfg = mg.config(sequence_packing_scheduler="dp_balanced", max_seqlen_per_dp_cp_rank=8192, thd_max_packed_sequences=8,
                    tensor_model_parallel_size=2)
    groups, *_ = ds.wrap_data_iterator(pairs(lengths), cfg, 8, dp=4, cp=1)
    assert max(len(rank) for mb in groups for rank in mb) <= 8
    assert packing_violations(groups, lengths, 4, 1, 8192, 4, 8) == []
    assert groups == integ.schedule_packing(lengths, profile=PROFILE, tp=2, pp=1, cp=1, dp=4, capacity=8192,
                                            max_num_seqs=8)
    # with padding that appends a dummy sequence, dev reserves its slot: 7 real documents a pack
    cfg = mg.config(sequence_packing_scheduler="dp_balanced", max_seqlen_per_dp_cp_rank=8192,
                    thd_max_packed_sequences=8, pad_packed_seq_alignment=128, tensor_model_parallel_size=2)
    groups, *_ = ds.wrap_data_iterator(pairs(lengths), cfg, 8, dp=4, cp=1)
    assert max(len(rank) for mb in groups for rank in mb) <= 7
    out, err = capsys.readouterr()
    assert err == "" and "at most 8 documents a pack" in out and "at most 7 documents a pack" in out


def test_dynamic_cp_drop_in_forwards_dev_arguments_and_schedules_as_the_plain_function(monkeypatch, capsys):
    from hydraplan.core.executors import dynamic_cp_violations

    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    lengths = [int(x) for x in np.random.default_rng(3).lognormal(np.log(1024), 1.5, 96).clip(128, 8192)]
    cfg = mg.config(sequence_packing_scheduler="default_dynamic_cp", max_seqlen_per_dp_cp_rank=2048,
                    min_dynamic_context_parallel_size=2, thd_max_packed_sequences=6, tensor_model_parallel_size=1)
    cls = ds.scheduler_map["default_dynamic_cp"]
    sched = cls(2048, 4, 4, None, max_num_seqs=6, min_cp_size=2)
    assert (sched.max_num_seqs, sched.min_cp_size) == (6, 2)
    groups, *_ = sched.run(pairs(lengths, first=500), 8, *(mg.Group(n) for n in (4, 1, 1, 16)), None, cfg)
    expect = integ.schedule_dynamic_cp(lengths, profile=PROFILE, tp=1, dpcp=16, max_seqlen_per_rank=2048,
                                       min_cp_size=2, max_num_seqs=6)
    assert groups == [[[500 + i for i in rank] for rank in mb] for mb in expect]
    target = sched.hydraplan_guard.target
    assert dynamic_cp_violations(expect, lengths, target) == [] and (target.min_cp_size, target.max_num_seqs) == (2, 6)
    out = capsys.readouterr().out
    assert "scheduling 16 DPxCP ranks at TP 1" in out and "at most 6 sequences" in out


def test_dynamic_cp_drop_in_passes_megatrons_padding_to_the_executor(monkeypatch, capsys):
    from hydraplan.core.executors import PackPadding

    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    lengths = [int(x) for x in np.random.default_rng(4).integers(128, 4000, 64)]
    for cfg_padding, want in [({}, PackPadding()),
                              ({"pad_packed_seq_alignment": "max"}, PackPadding("max", "append_dummy_seq")),
                              ({"pad_packed_seq_alignment": 64, "thd_tail_padding_policy": "extend_last"},
                               PackPadding(64, "extend_last")),
                              ({"pad_packed_seq_alignment": 64, "cuda_graph_impl": "local"}, PackPadding("max"))]:
        cfg = mg.config(sequence_packing_scheduler="default_dynamic_cp", max_seqlen_per_dp_cp_rank=8192,
                        tensor_model_parallel_size=2, **cfg_padding)
        sched = ds.scheduler_map["default_dynamic_cp"](8192, 1, 8, None, max_num_seqs=None, min_cp_size=1)
        groups, *_ = sched.run(pairs(lengths), 8, *(mg.Group(n) for n in (8, 1, 1, 8)), None, cfg)
        assert sched.hydraplan_guard.target.padding == want
        assert groups == integ.schedule_dynamic_cp(lengths, profile=PROFILE, tp=2, dpcp=8, max_seqlen_per_rank=8192,
                                                   padding=want)
    assert "Megatron's" not in capsys.readouterr().err  # hydraplan scheduled every batch, padded or not


def test_schedule_dynamic_cp_obeys_the_executor_and_is_never_slower_than_default_dynamic_cp():
    """The plain function on Megatron's benchmark workload (lognormal lengths, 16 DPxCP ranks at TP 1,
    max_seqlen_per_dp_cp_rank 2048): every rule held, min_cp_size and max_num_seqs included, and never slower than
    Megatron's scheduler where its schedule fits in memory."""
    from hydraplan.core.executors import dynamic_cp_blocks, dynamic_cp_time, dynamic_cp_violations
    from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule

    rng = np.random.default_rng(11)
    compared = 0
    for min_cp, cap in [(1, None), (2, 4)]:
        target = integ.dynamic_cp_target(PROFILE, tp=1, dpcp=16, max_seqlen_per_rank=2048, min_cp_size=min_cp,
                                         max_num_seqs=cap)
        for _ in range(3):
            lengths = [int(x) for x in rng.lognormal(np.log(1024), 1.5, 128).clip(128, 8192)]
            ours = integ.schedule_dynamic_cp(lengths, profile=PROFILE, tp=1, dpcp=16, max_seqlen_per_rank=2048,
                                             min_cp_size=min_cp, max_num_seqs=cap)
            assert dynamic_cp_violations(ours, lengths, target) == []
            assert min(len(ranks) for mb in ours for ranks, _ in dynamic_cp_blocks(mb)) >= min_cp
            theirs = default_dynamic_cp_schedule(lengths, dpcp=16, max_seqlen_per_rank=2048, min_cp_size=min_cp)
            if not dynamic_cp_violations(theirs, lengths, target):
                compared += 1
                assert dynamic_cp_time(target, ours, lengths) <= dynamic_cp_time(target, theirs, lengths) * (1 + 1e-12)
    assert compared >= 2


# ------------------------------------------------------------------------------------------- fallbacks
def hcp(ds, limit: int, ranks: int):
    return ds.BalancedCPScheduler(max_seq_len_per_rank=limit, dp_cp_group=mg.Group(ranks))


def test_a_dpcp_size_hybrid_cp_cannot_take_falls_back_to_megatron_with_one_line(monkeypatch, capsys):
    """48 GPUs at TP 4: 12 DPxCP ranks, not a power of two. The first batch says so in one line and every batch
    is Megatron's BalancedCPScheduler's (before: the first batch raised, stopping the job)."""
    ds = mg.put(monkeypatch, mg.release())
    integ.install(PROFILE)
    capsys.readouterr()
    sched = hcp(ds, 12_000, 12)
    cfg = mg.config(tensor_model_parallel_size=4)
    for seed in range(3):
        batch = pairs(short_docs(60, seed))
        assert sched.get_groups_and_subsamples(batch, cfg) == \
            mg.BalancedCPScheduler(12_000, mg.Group(12)).get_groups_and_subsamples(batch, cfg)
    out, err = capsys.readouterr()
    one_line(err, "hybrid CP", "power of two", "12", "Megatron's BalancedCPScheduler schedules every batch")
    assert out == ""


def test_a_profile_without_the_scheme_falls_back_with_one_line(monkeypatch, capsys):
    ds = mg.put(monkeypatch, mg.release())
    integ.install(PROFILE)
    capsys.readouterr()
    batch = pairs(short_docs(30))
    cfg = mg.config(tensor_model_parallel_size=3)
    assert hcp(ds, 8000, 8).get_groups_and_subsamples(batch, cfg) == \
        mg.BalancedCPScheduler(8000, mg.Group(8)).get_groups_and_subsamples(batch, cfg)
    one_line(capsys.readouterr().err, "no scheme <3,1,1>", "Megatron's BalancedCPScheduler")


def test_a_batch_hydraplan_cannot_schedule_goes_to_megatron_and_the_rest_stay_hydraplans(monkeypatch, capsys):
    """TP 2 on 16 DPxCP ranks with max_seqlen_per_dp_cp_rank above MaxLen of <2,1,1>: the first call warns of it
    in one line; a batch holding a sequence no CP size holds in memory goes to Megatron's scheduler, with one line
    (for the 1st, 2nd, 4th... such batch), and the next batch is hydraplan's again."""
    ds = mg.put(monkeypatch, mg.release())
    integ.install(PROFILE)
    capsys.readouterr()
    sched = hcp(ds, 60_000, 16)
    cfg = mg.config(tensor_model_parallel_size=2)
    target = HybridCP.of(integ.schedules.load(PROFILE), tp=2, dpcp=16, max_seqlen_per_rank=60_000)
    too_long = max(target.max_lens) + 1000
    good = short_docs(200)
    _, ids = sched.get_groups_and_subsamples(pairs(good), cfg)
    out, err = capsys.readouterr()
    one_line(out, "scheduling 16 DPxCP ranks at TP 2")
    one_line(err, "above MaxLen of <2,1,1>")
    assert ids == integ.schedule_hybrid_cp(good, profile=PROFILE, tp=2, dpcp=16, max_seqlen_per_rank=60_000)
    bad = [*good[:50], too_long]
    for k in range(1, 5):
        assert sched.get_groups_and_subsamples(pairs(bad), cfg) == \
            mg.BalancedCPScheduler(60_000, mg.Group(16)).get_groups_and_subsamples(pairs(bad), cfg)
        err = capsys.readouterr().err
        if k in (1, 2, 4):
            one_line(err, f"batch {k + 1}", f"{too_long}", f"({k} of {k + 1} batches so far)")
        else:
            assert err == ""
    _, ids = sched.get_groups_and_subsamples(pairs(good), cfg)
    assert hybrid_cp_violations(ids, good, 16, 60_000) == [] and capsys.readouterr().err == ""


def test_a_packing_batch_hydraplan_cannot_schedule_goes_to_dev_dp_balanced(monkeypatch, capsys):
    """Fewer documents than the replicas need packs: hydraplan's packing cannot schedule the batch; dev's own
    dp_balanced raises too (its assertion), as it would without the plugin: the plugin never makes it worse."""
    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    capsys.readouterr()
    cfg = mg.config(sequence_packing_scheduler="dp_balanced", max_seqlen_per_dp_cp_rank=8192, tensor_model_parallel_size=2)
    with pytest.raises(Exception) as theirs:
        mg.DevDpBalanced(8192, 1, 4, None).run(pairs([100, 200]), 8, None, None, None, mg.Group(4), None, cfg)
    with pytest.raises(type(theirs.value)):
        ds.wrap_data_iterator(pairs([100, 200]), cfg, 8, dp=4, cp=1)
    out, err = capsys.readouterr()
    one_line(out, "packing for <2,1,1> x 4 replicas")
    one_line(err, "batch 1", "cannot fill", "Megatron's dp_balanced schedules it (1 of 1 batches so far)")


def test_packing_falls_back_to_this_megatrons_own_dp_balanced(monkeypatch, capsys):
    """A TP the profile has no scheme for: every batch is dev's own dp_balanced, with its max_num_seqs (the
    fallback was a copy of main's, which packs any number of documents)."""
    from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule

    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    capsys.readouterr()
    lengths = short_docs(160)
    cfg = mg.config(sequence_packing_scheduler="dp_balanced", max_seqlen_per_dp_cp_rank=8192, thd_max_packed_sequences=5,
                    tensor_model_parallel_size=3)
    groups, *_ = ds.wrap_data_iterator(pairs(lengths), cfg, 8, dp=4, cp=1)
    assert groups == dp_balanced_schedule(lengths, 8192, 4, 1, max_num_seqs=5)
    assert max(len(rank) for mb in groups for rank in mb) <= 5
    one_line(capsys.readouterr().err, "no scheme <3,1,1>", "Megatron's dp_balanced schedules every batch")


def test_dynamic_cp_with_pipeline_parallelism_is_left_to_megatron(monkeypatch, capsys):
    ds = mg.put(monkeypatch, mg.dev())
    integ.install(PROFILE)
    capsys.readouterr()
    lengths = short_docs(64)
    cfg = mg.config(sequence_packing_scheduler="default_dynamic_cp", max_seqlen_per_dp_cp_rank=2048,
                    pipeline_model_parallel_size=2)
    groups, *_ = ds.wrap_data_iterator(pairs(lengths), cfg, 8, dp=8, cp=1)
    assert groups == mg.DevDefaultDynamicCP(2048, 1, 8, None).get_groups_and_subsamples(pairs(lengths))
    one_line(capsys.readouterr().err, "pipeline_model_parallel_size 2", "Megatron's default_dynamic_cp")


def test_check_schedule_env_var_is_read_and_a_bad_value_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("HYDRAPLAN_CHECK_SCHEDULE", "50")
    assert Guard("x", "y").every == 50
    monkeypatch.setenv("HYDRAPLAN_CHECK_SCHEDULE", "often")
    assert Guard("x", "y").every == 0
    one_line(capsys.readouterr().err, "HYDRAPLAN_CHECK_SCHEDULE", "often")
    monkeypatch.delenv("HYDRAPLAN_CHECK_SCHEDULE")
    assert Guard("x", "y").every == 0


def _compare_worker(rank: int, world: int, port: int, out: str) -> None:
    """Two ranks over gloo schedule through hybrid CP's drop-in, comparing every 2 batches: batches 1 and 2 equal,
    batch 3 differs on rank 1 (a rank computing another schedule): both ranks see it at batch 3 and hand it and
    every later batch to Megatron's scheduler."""
    import types

    import torch.distributed as dist

    stand = mg
    init_gloo(rank, world, port)
    ds = stand.release()
    sys.modules.update({n: types.ModuleType(n) for n in stand.PARENTS})
    sys.modules[stand.MODULE] = ds
    integ.install(PROFILE, check_every=2)
    sched = ds.BalancedCPScheduler(max_seq_len_per_rank=8000, dp_cp_group=dist.group.WORLD)
    cfg = stand.config(tensor_model_parallel_size=2)
    got = []
    for b in range(4):
        lengths = short_docs(40, seed=b + (10 * rank if b == 2 else 0))
        _, ids = sched.get_groups_and_subsamples(pairs(lengths), cfg)
        mine = integ.schedule_hybrid_cp(lengths, profile=PROFILE, tp=2, dpcp=2, max_seqlen_per_rank=8000)
        got.append("hydraplan" if ids == mine else "megatron")
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"got": got, "guard": sched.hydraplan_guard.disabled}, f)
    dist.destroy_process_group()


def test_schedules_compared_across_ranks_fall_back_together_when_they_differ(tmp_path):
    spawn(_compare_worker, (2, free_port(), str(tmp_path / "r")), 2)
    res = [json.loads((tmp_path / f"r.{r}").read_text()) for r in range(2)]
    for r in res:  # batch 1 compared (equal), 2 not compared, 3 compared (differ): Megatron's from then on
        assert r["got"] == ["hydraplan", "hydraplan", "megatron", "megatron"]
        assert "schedules differ across the DPxCP group at batch 3 (ranks [1] differ from rank 0)" in r["guard"]
    assert digest([[[1, 2]]]) != digest([[[2, 1]]]) and digest([[[1, 2]]]) == digest([[[1, 2]]])
