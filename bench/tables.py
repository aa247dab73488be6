"""The docs' generated tables: each function makes one Markdown table (or output block) from bench/results, for
a `<!-- bench: NAME key=value ... -->` region of a page (bench/docs.py). Rows and columns follow what the
results hold, so a smoke run's files make the same tables, smaller."""

from __future__ import annotations

from collections.abc import Callable

from bench.docs import FigureError, Results

DELAYED = ("wlb-llm", "hydraplan-delay")  # the methods that move documents to later iterations


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(header), _row(["---"] * len(header)), *map(_row, rows)])


def _tokens(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}K"


def _short(dataset: str) -> str:
    return dataset.removeprefix("builtin:")


def _code(lines: list[str]) -> str:
    return "\n".join(["```", *lines, "```"])


def compare(results: Results, profile: str = "h100-llama2-7b", objective: str = "end-to-end", cells: str = "e2e") -> str:
    """Methods x configurations of compare.json for one objective and the profiles named (comma-separated):
    Megatron's mean iteration in seconds, every other method's speedup over it, end to end (`cells=both`: end to
    end / propagation). Bold: the fastest method that trains each batch in its own iteration and the fastest
    that delays documents."""
    profiles = profile.split(",")
    configs = [c for c in results["compare"]["configs"] if c["profile"] in profiles and c["objective"] == objective]
    if not configs and results.structural:  # a smoke run's files: its one profile stands in for those named
        configs = [c for c in results["compare"]["configs"] if c["objective"] == objective]
    if not configs:
        raise FigureError(f"compare.json: no {objective} configuration of {profile}")
    methods = list(configs[0]["mean_iteration_s"])
    both = cells == "both"
    best = {}
    for c in configs:
        s = c["end_to_end_speedup_vs_megatron"]
        best[c["id"]] = {max((m for m in methods if m not in DELAYED), key=s.get), max(DELAYED, key=s.get)}
    rows = []
    for m in methods:
        row = [f"`{m}`"]
        for c in configs:
            e2e, prop = c["end_to_end_speedup_vs_megatron"][m], c["propagation_speedup_vs_megatron"][m]
            if m == "megatron":
                cell = f"{c['mean_iteration_s'][m]:.3g} s" + (f" / {c['mean_estimate_s'][m]:.3g} s" if both else "")
            else:
                cell = f"{e2e:.2f}x" + (f" / {prop:.2f}x" if both else "")
                cell = f"**{cell}**" if m in best[c["id"]] and not both else cell
            row.append(cell)
        rows.append(row)
    rows.append(["delay, iterations/token: wlb-llm / hydraplan-delay",
                 *(f"{c['wlb_delay_iters_per_token']:.2g} / {c['hydraplan_delay_iters_per_token']:.2g}" for c in configs)])
    name = (lambda c: f"{c['profile']} ") if len(profiles) > 1 else (lambda c: "")
    return _table(["method", *(f"{name(c)}{_short(c['dataset'])} {_tokens(c['tokens_per_iter'])}" for c in configs)], rows)


def demo(results: Results, output: str) -> str:
    """A fenced block of what `make demo`'s commands printed (demo.json's output: pack_tail, compare_table, ...)."""
    return _code(results["demo"]["output"][output])


def _bytes(n: float) -> str:
    v, unit = (n / 1e6, "MB") if n >= 1e6 else (n / 1e3, "KB")
    return f"{v:.1f} {unit}" if v < 10 else f"{v:.0f} {unit}"


def _percent(x: float) -> str:
    """Two significant digits (6.8%, 41%, 146%)."""
    return f"{float(f'{x * 100:.2g}'):g}%" if x < 1 else f"{x:.0%}"


TARGET_WORDS = {"s_per_iter": "{:g} s per iteration", "first_plan_s": "{:g} s first plan", "compact_ratio": "compact {:.0%}"}


def scale(results: Results) -> str:
    """`pack` at each size, one process: candidates, time to the first plan and per iteration (CPU seconds),
    dispatches, plan bytes, process groups, and the targets set per size."""
    data = results["scale"]
    runs, targets = data["runs"], data["targets"]

    def target(r: dict) -> str:
        t = targets.get(str(r["gpus"]), {})
        return ", ".join(TARGET_WORDS[k].format(v) for k, v in t.items()) or "-"

    def groups(r: dict, total: str, most: str) -> str:
        return f"{r['process_groups'][total]:,} ({r['process_groups'][most]})"

    head = ["`pack`, one process", *(f"{r['gpus']} GPUs, {_tokens(r['tokens_per_iter'])}" for r in runs)]
    return _table(head, [
        ["candidates (proposed and kept, plus `static`)", *(str(r["candidates"]) for r in runs)],
        ["to the first plan written (imports, load, propose, static baseline)",
         *(f"{r['first_plan_cpu_s']:.2g} s" for r in runs)],
        [f"per iteration after it (mean of {runs[0]['iterations'] - 1})", *(f"{r['s_per_iter_cpu_mean']:.2g} s" for r in runs)],
        ["candidates dispatched per iteration (the rest ruled out before)",
         *(f"{r['dispatched_per_iter_mean']:.1f}" for r in runs)],
        ["seconds per dispatch", *(f"{r['dispatch_s_mean']:.2g} s" for r in runs)],
        ["a plan as JSON", *(_bytes(r["json_bytes_per_plan"]) for r in runs)],
        ["a plan compact (`--format compact`)", *(f"{_bytes(r['compact_bytes_per_plan'])} ({_percent(r['compact_ratio'])})"
                                                  for r in runs)],
        ["process groups made at start-up (at most per rank)", *(groups(r, "startup", "per_rank_max") for r in runs)],
        [f"of them used by the {runs[0]['iterations']} plans", *(f"{r['process_groups']['used_by_plans']:,}" for r in runs)],
        ["the family when any scheme may be used (at most per rank)",
         *(groups(r, "startup_any_scheme", "per_rank_max_any_scheme") for r in runs)],
        ["target", *(target(r) for r in runs)],
    ])


def online(results: Results) -> str:
    """online.json: rank 0's wait for each plan when the job plans while it trains, per planning layout."""
    def what(r: dict) -> str:
        procs = f"{r['planners_per_node']} planner process{'es' if r['planners_per_node'] > 1 else ''}"
        return f"1 node, {procs}" if r["nodes"] == 1 else f"{r['nodes']} nodes (torchrun agents), {procs} each"

    rows = [[what(r), f"{r['first_wait_s']:.2f} s", f"{r['max_later_wait_s']:.3f} s",
             "yes" if r["plans_equal_pack"] else "**no**", f"{r['max_abs_param_diff']:.2g}"]
            for r in results["online"]["runs"]]
    return _table(["planning", "first plan", "later plans, at most", "plans equal `pack`'s", "max parameter difference"],
                  rows)


def bound(results: Results) -> str:
    """Per configuration of bound.json, under each cost model: the plan, plan / tight bound, tight / old bound."""
    cases = {(c["profile"], c["dataset"], c["gpus"], c["objective"]): c for c in results["bound"]["cases"]}
    configs = sorted({k[:3] for k in cases}, key=lambda k: (k[0].split("-")[0], int(k[0].split("-")[-1][:-1]), k[2], k[1]))

    def cells(key: tuple) -> list[str]:
        c = cases.get(key)
        if c is None:
            return ["not run", "", ""]
        b = c["batches"][0]
        return [f"{b['plan_s']:.3f} s", f"{b['plan_over_bound']:.3f}", f"{b['tight_bound_s'] / b['loose_bound_s']:.3f}"]

    rows = [[p, _short(d), str(g), *cells((p, d, g, "propagation")), *cells((p, d, g, "end-to-end"))] for p, d, g in configs]
    return _table(["profile", "dataset", "GPUs", "propagation: plan", "plan / tight bound", "tight / old bound",
                   "end to end: plan", "plan / tight bound", "tight / old bound"], rows)


ISSUE_BEFORE = {  # issue 28's plans of before, by objective and configuration
    "propagation": {("h100-llama2-32b", "builtin:wikipedia", 64): 2.132, ("a800-llama2-32b", "builtin:wikipedia", 64): 4.934,
                    ("h100-llama2-13b", "builtin:wikipedia", 256): 0.903, ("h100-llama2-32b", "builtin:prolong", 256): 2.437},
    "end-to-end": {("h100-llama2-13b", "builtin:wikipedia", 256): 0.927, ("h100-llama2-32b", "builtin:prolong", 256): 2.573},
}


def bound_issue(results: Results) -> str:
    """bound.json's rows of issue 28 (and its 128K row): the plan of before (the issue's), the better plan found
    by hand there, and pack's plan now, on the same batches."""
    def fast(now: float, better: float) -> str:
        return "yes" if now <= better * (1 + 5e-4) else f"no (+{now / better - 1:.1%})"

    rows = []
    for c in results["bound"]["cases"]:
        if "better_plan_s" in c:
            before = ISSUE_BEFORE[c["objective"]][(c["profile"], c["dataset"], c["gpus"])]
            rows.append([f"{c['profile']} {_short(c['dataset'])} {c['gpus']} GPUs, {c['objective']}", f"{before:.3f} s",
                         f"{c['better_plan_s']:.3f} s", f"{c['plan_s_mean']:.3f} s: {c['batches'][0]['strategy']}",
                         fast(c["plan_s_mean"], c["better_plan_s"])])
    L = results["bound"].get("long_context")
    if L:
        what = f"{L['profile']} {_short(L['dataset'])} 128K, {_tokens(L['tokens_per_iter'])} tokens, {L['gpus']} GPUs"
        rows.append([f"{what} ({L['iterations']} iterations), {L['objective']}", "3.019 s mean",
                     f"{L['better_plan_mean_s']:.3f} s mean", f"{L['plan_s_mean']:.3f} s mean",
                     fast(L["plan_s_mean"], L["better_plan_mean_s"])])
    return _table(["configuration", "before", "better plan found by hand", "now", "at least as fast"], rows)


def cad(results: Results) -> str:
    """Per configuration of cad.json: wlb-nodelay's end-to-end seconds, the speedups over it, how often CAD is chosen."""
    rows = []
    for c in results["cad"]["configs"]:
        head = [c["profile"], _short(c["dataset"]), f"{c['context_len'] // 1024}K", _tokens(c["tokens_per_iter"])]
        if "skipped" in c:
            rows.append(head + ["no scheme holds it", "", "", "", ""])
            continue
        s = c["speedup_vs_wlb_nodelay"]
        cells = [f"**{s[m]:.2f}x**" if m == c["best"] else f"{s[m]:.2f}x" for m in ("hydraplan", "cad", "hydraplan-cad")]
        rows.append(head + [f"{c['end_to_end_s']['wlb-nodelay']:.3g} s", *cells, f"{c['cad_share']:.0%}"])
    return _table(["profile", "dataset", "context", "tokens", "`wlb-nodelay`", "`hydraplan`", "`cad`", "`hydraplan-cad`",
                   "CAD chosen"], rows)


def overlap(results: Results) -> str:
    """Exposed sync with and without overlap, per rank count of overlap.json."""
    what = {2: "2 (a core per rank)", 4: "4 (two ranks per core)"}
    rows = [[what.get(r["ranks"], str(r["ranks"])), f"{r['exposed_overlap_s']:.3f} s", f"{r['exposed_no_overlap_s']:.3f} s",
             f"{r['ratio']:.2f}"] for r in sorted(results["overlap"]["rows"], key=lambda r: r["ranks"])]
    return _table(["gloo ranks on this 2-core machine", "exposed sync, overlap", "exposed sync, `--no-overlap`", "ratio"],
                  rows)


def memory(results: Results) -> str:
    """Per recomputation mode, scheme and stage of memory.json, the rank furthest from the model."""
    rows = [[r.get("mode", "none"), r["scheme"], str(r["stage"]), str(r["tokens"]), f"{r['peak_mib']:.2f} MiB",
             f"{r['model_mib']:.2f} MiB", f"{r['ratio']:.3f}"] for r in results["memory"]["per_scheme_stage"]]
    return _table(["recomputation", "scheme", "stage", "micro-batch (tokens, MaxLen)", "measured peak", "model",
                   "measured / model"], rows)


def profile_check(results: Results) -> str:
    """profile.json's end-to-end checks: whole-iteration error of the measured profile's plans."""
    what = {2: "2 (a core each)", 4: "4 (two per core)"}
    rows = []
    for e in results["profile"]["end_to_end_check"]:
        worst = next(r for r in e["iterations"] if r["iteration"] == e["worst_iteration"])
        layout = "+".join(f"{n}x{s}" for s, n in _count(p["scheme"] for p in worst["pipelines"]).items())
        rows.append([what.get(e["ranks"], str(e["ranks"])), f"{e['profile']['network']['intra_node_GBps']:.2g} GB/s",
                     f"{e['mean_rel_err']:.1%}", f"{e['worst_rel_err']:.1%} ({layout})", f"{e['mean_propagation_err']:+.1%}",
                     f"{e['mean_sync_err']:+.1%}", f"{e['mean_rel_err_no_overlap']:.1%}"])
    return _table(["gloo ranks (2-core machine)", "LNK measured", "mean error", "worst iteration", "mean propagation part",
                   "mean sync part", "mean error, sync not hidden"], rows)


def _count(items) -> dict:
    """How often each item occurs, in order of first occurrence."""
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def cpu_tiny(results: Results) -> str:
    """The bundled measured profile (profiles/cpu-tiny.json, made by `hydraplan profile`): MaxLen, T(l) and its fit."""
    from hydraplan.store.profiles import load_profile

    rows = []
    for s in load_profile("cpu-tiny").schemes:
        fit = s.model_extra.get("fit", {}) if s.model_extra else {}
        rows.append([s.label, str(s.max_len), f"{s.time.a:.3g}", f"{s.time.b:.3g}", f"{s.time.c:.2g}",
                     f"{fit.get('r2', float('nan')):.3f}", f"{fit.get('worst_rel_err', float('nan')):.0%}",
                     f"{fit.get('packed_worst_rel_err', float('nan')):.0%}"])
    return _table(["scheme", "MaxLen", "a", "b", "c (s)", "R^2", "worst error", "worst error, packings"], rows)


def hydraulis(results: Results) -> str:
    """analytic.json: the A800 LLaMA-2 7B profile against Hydraulis' fitted coefficients and MaxLen."""
    def k(n: int) -> str:
        return f"{float(f'{n / 1000:.3g}'):g}K"

    rows = [[r["scheme"], *(f"{r[f'{x}_ratio']:.2f}" if f"{x}_ratio" in r else "" for x in "abc"),
             f"{k(r['max_len_shipped'])} ({r['shipped_over_hydraulis'] - 1:+.1%})", k(r["max_len_hydraulis"]),
             k(r["max_len_selective"]), k(r["max_len_full"])]
            for r in results["analytic"]["hydraulis"]]
    return _table(["scheme", "a ours/theirs", "b ours/theirs", "c ours/theirs", "MaxLen ours", "MaxLen Hydraulis",
                   "ours, selective recomputation", "ours, full recomputation"], rows)


def long(results: Results, part: str) -> str:
    """long.json: one long-context configuration, every method's compare row (end to end) and its most used
    strategy, then the schemes pack's plans use per iteration."""
    c = results["long"][part]
    rows = [[f"`{r['method']}`", f"{r['mean_iteration_s']:.3g} s", f"{r['speedup_vs_megatron']:.2f}x",
             r["pipelines"].get(r["strategy"], r["strategy"])]
            for r in c["compare"]["methods"]]
    plans = [[f"pack, iteration {p['iteration']}", f"{p['iteration_s']:.3g} s", f"longest {_tokens(p['longest'])}",
              " + ".join(f"{n}x{k}" for k, n in p["pipelines"].items())] for p in c["pack"]["plans"]]
    return _table(["method", "mean iteration", "speedup over megatron", "most used strategy"], rows + plans)


def timings(results: Results) -> str:
    """What each bench's last full run took (its file's meta), longest first, and the sum: what `make bench` costs."""
    from bench.run import names

    def full(meta: dict, name: str) -> dict:
        """The last full run's record: a partial run (`python -m bench NAME PART`) keeps the earlier ones."""
        runs = [meta, *meta.get("earlier", [])]
        return next((m for m in runs if m.get("command") == f"python -m bench {name}"), meta)

    metas = {n: full(results[n].get("meta", {}), n) for n in names()}
    rows = sorted(metas.items(), key=lambda kv: -kv[1].get("wall_s", 0))

    def secs(m: dict, key: str) -> str:
        return f"{m[key] / 60:.1f} min" if key in m else "not recorded"

    total = {k: sum(m.get(k, 0) for m in metas.values()) for k in ("wall_s", "cpu_s")}
    return _table(["bench", "wall", "CPU (all its processes)", "made"],
                  [[f"`{n}`", secs(m, "wall_s"), secs(m, "cpu_s"), m.get("date", "unknown")[:10]] for n, m in rows]
                  + [["all", secs(total, "wall_s"), secs(total, "cpu_s"), ""]])


def megatron_hcp(results: Results) -> str:
    """megatron.json's hybrid-CP rows: Megatron's scheduler at its best TP that fits memory, the plugin at that TP and
    at its own best, the work lower bound's share, planning CPU ms per batch."""
    rows = []
    for c in results["megatron"]["hybrid_cp"]:
        bound = c["plugin_vs_bound_same_tp"]
        rows.append([_short(c["dataset"]), f"{c['context_len'] // 1024}K", _tokens(c["tokens_per_iter"]),
                     f"{c['megatron_best_s']:.3f} s (TP {c['megatron_best_tp']})",
                     f"{c['speedup_same_tp']:.2f}x (at least {c['min_iteration_speedup_same_tp']:.2f}x)",
                     f"{c['speedup_best_tp']:.2f}x (TP {c['plugin_best_tp']})", f"{bound:.3f}",
                     f"{c['plan_ms_max']:.0f} ms / {c['megatron_plan_ms_max']:.0f} ms"])
    return _table(["dataset", "context", "tokens", "Megatron, its best TP", "plugin, same TP (every batch)",
                   "plugin, its best TP", "plugin / lower bound", "planning, max per batch: plugin / Megatron"], rows)


def megatron_packing(results: Results) -> str:
    """megatron.json's packing rows: dp_balanced against the plugin in compare's Megatron layout and at each
    one's fastest layout, end to end."""
    rows = []
    for c in results["megatron"]["packing"]:
        rows.append([c["profile"].removeprefix("h100-llama2-"), _short(c["dataset"]), f"{c['context_len'] // 1024}K",
                     f"`{c['same_layout']}`", f"{c['megatron_same_s']:.3f} s",
                     f"{c['speedup_same_layout']:.2f}x (at least {c['min_iteration_speedup_same_layout']:.2f}x)",
                     f"`{c['megatron_best_layout']}` {c['megatron_best_s']:.3f} s",
                     f"`{c['plugin_best_layout']}` {c['speedup_best_layouts']:.2f}x",
                     f"{c['plan_ms_same_layout']:.0f} ms"])
    return _table(["model", "dataset", "context", "layout", "dp_balanced", "plugin (every batch)",
                   "dp_balanced's best layout", "plugin's best layout", "planning, max per batch"], rows)


def fidelity(results: Results) -> str:
    """fidelity.json: per source of data/published, its class, the points predicted within the bound and predicted /
    published (median, range), and the points left out: how many and predicted / published where computable."""
    rows = []
    for s in results["fidelity"]["sources"]:
        spread = f"{s['min_ratio']:.2f}-{s['max_ratio']:.2f}" if s["points"] else ""
        missing = s["excluded"] - s["excluded_predicted"]
        rows.append([f"`{s['id']}`", s["class"], str(s["points"]), f"{s['median_ratio']:.2f}" if s["points"] else "",
                     spread, (str(s["excluded"]) + (f" ({missing} not computable)" if missing else "")) if s["excluded"] else "",
                     f"{s['excluded_min_ratio']:.2f}-{s['excluded_max_ratio']:.2f}" if s["excluded_predicted"] else ""])
    return _table(["source (data/published/)", "class", "points", "predicted / published, median", "range", "left out",
                   "left out: predicted / published"], rows)


def fidelity_dcp(results: Results) -> str:
    """fidelity.json's records of Megatron's dynamic-CP benchmark: per GPU count, dp_balanced's and dynamic CP's
    iteration (the 10% trimmed mean) measured and predicted, and the speedup published and predicted (whole
    iteration, and propagation alone)."""
    recs = {r["point"]: r for r in results["fidelity"]["records"] if r["source"] == "megatron-lm-dynamic-cp"}
    rows = []
    for x in results["fidelity"]["dcp"]["speedups"]:
        if x["statistic"] != "trimmed":
            continue
        base, dcp = recs[f"dp_balanced-{x['gpus']}gpu-trimmed"], recs[f"dcp-{x['gpus']}gpu-trimmed"]
        rows.append([str(x["gpus"]), f"{base['published'] * 1e3:.0f} ms", f"{base['predicted'] * 1e3:.0f} ms",
                     f"{dcp['published'] * 1e3:.0f} ms", f"{dcp['predicted'] * 1e3:.0f} ms", f"{x['published']:.2f}x",
                     f"{x['predicted']:.2f}x ({x['propagation']:.2f}x)"])
    return _table(["GPUs", "dp_balanced, measured", "predicted", "dynamic CP, measured", "predicted",
                   "speedup, published", "predicted (propagation alone)"], rows)


def fit_errors(results: Results) -> str:
    """analytic.json: per bundled analytic profile, the canonical form's worst and median fit error against the stage
    model over the lengths its schemes serve, and the worst scheme."""
    rows = [[f"`{f['id']}`", _percent(f["worst"]), f"`{f['worst_scheme']}`", _percent(f["median"]),
             f"{f['exact_share']:.0%}"] for f in results["analytic"]["fit"]]
    return _table(["profile", "worst fit error", "at", "median", "schemes exact"], rows)


def megatron_dcp_benchmark(results: Results) -> str:
    """megatron.json's dynamic-CP rows on Megatron's own benchmark: its scheduler, the plugin, the lower bound (and
    the speedup over Megatron it leaves at most) and dp_balanced at CP 4, per GPU count."""
    rows = []
    for r in results["megatron"]["dynamic_cp"]["benchmark"]["rows"]:
        rows.append([str(r["gpus"]), str(r["samples"]), f"{r['megatron_s'] * 1e3:.1f} ms ({r['megatron_micro_batches']:.1f})",
                     f"{r['plugin_s'] * 1e3:.1f} ms ({r['plugin_micro_batches']:.1f})",
                     f"{r['speedup']:.2f}x (at least {r['min_iteration_speedup']:.2f}x)", f"{r['plugin_vs_bound']:.3f}",
                     f"{r['megatron_vs_bound']:.2f}x", f"{r['dp_balanced_s'] * 1e3:.1f} ms", f"{r['plan_ms_max']:.0f} ms"])
    return _table(["GPUs", "samples", "default_dynamic_cp (micro-batches)", "plugin (micro-batches)",
                   "plugin (every batch)", "plugin / lower bound", "at most (Megatron / bound)", "dp_balanced, CP 4",
                   "planning, max per batch"], rows)


def megatron_dcp_corpora(results: Results) -> str:
    """megatron.json's dynamic-CP rows on the corpora: each method at the setting chosen on tuning batches, on
    held-out ones; the plugin at Megatron's setting; the lower bound (and the speedup it leaves at most); planning CPU
    ms."""
    rows = []
    for c in results["megatron"]["dynamic_cp"]["corpora"]:
        rows.append([_short(c["dataset"]), f"{c['context_len'] // 1024}K", _tokens(c["tokens_per_iter"]),
                     f"{c['megatron_s']:.3f} s (TP {c['megatron_tp']}, {c['megatron_limit']})",
                     f"{c['speedup_same_setting']:.2f}x (at least {c['min_iteration_speedup_same_setting']:.2f}x)",
                     f"{c['speedup']:.2f}x (TP {c['plugin_tp']})", f"{c['plugin_vs_bound']:.3f}",
                     f"{c['speedup_bound']:.2f}x", f"{c['plan_ms_max']:.0f} ms / {c['megatron_plan_ms_max']:.0f} ms"])
    return _table(["dataset", "context", "tokens", "Megatron, its best TP and limit", "plugin, same setting (every batch)",
                   "plugin, its best TP", "plugin / lower bound", "at most (Megatron / bound)",
                   "planning, max per batch: plugin / Megatron"], rows)


def recalibration(results: Results) -> str:
    """recalibration.json beside today's results: each headline figure before issue 46's profiles (the commit it names)
    and now, and now / before."""
    def show(v: float, unit: str) -> str:
        return f"{v:.2f}x" if unit == "x" else f"{v:.3f} s" if unit == "s" else f"{v:.3f}"

    rows = []
    for f in results["recalibration"]["figures"]:
        now = results.select(f["file"], f["selector"])
        rows.append([f["figure"], f["model"], show(f["before"], f["unit"]), show(now, f["unit"]), f"{now / f['before']:.2f}"])
    return _table(["figure", "cost model", "old profiles", "recalibrated", "now / before"], rows)


TABLES: dict[str, Callable[..., str]] = {f.__name__: f for f in (compare, demo, scale, online, bound, bound_issue, cad, overlap,
                                                                   memory, profile_check, cpu_tiny, hydraulis, long, timings,
                                                                   megatron_hcp, megatron_packing, fidelity, fidelity_dcp,
                                                                   fit_errors, megatron_dcp_benchmark, megatron_dcp_corpora,
                                                                   recalibration)}
