"""The compare report: compare.json, PNG plots and a self-contained report.html (plots embedded).

Plots: per-iteration latency per method in the compare's objective (hydraplan dots coloured by the strategy
chosen, like Hydraulis Fig. 15a), mean latency per method as stacked bars (propagation, then exposed sync
on top) with speedups, the length histogram (sequences and tokens per
length range, like Hydraulis Fig. 1), per-pipeline load bars of one iteration, and the 1F1B timeline of
the slowest pipeline of that iteration for megatron and hydraplan.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np

from hydraplan.core.cluster import objective_of, ranked
from hydraplan.core.schedules import simulate_1f1b
from hydraplan.core.schema import CompareResult
from hydraplan.methods import baselines as bl
from hydraplan.methods.compare import CompareOutcome, most_common
from hydraplan.methods.registry import METHODS
from hydraplan.store.fileio import atomic_write_text, ensure_folder, save_figure, write_model

COLORS = {m.name: m.color for m in METHODS}  # methods/registry.py
PLOTS = ("latency", "methods", "lengths", "load", "gantt")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _title(r: CompareResult) -> str:
    return (f"{r.profile} · {r.dataset} · {r.gpus} GPUs · {r.tokens_per_iter // 1000}K tokens/iter · "
            f"context {r.context_len // 1024}K · {objective_of(r.objective)} objective")


def objective_series(r: CompareResult, name: str) -> list[float]:
    """Per-iteration times in the compare's objective (end to end, or propagation)."""
    m = r.methods[name]
    return ranked(r.objective, m.iterations_s, m.iteration_s or m.iterations_s)


def showcase_iteration(outcome: CompareOutcome) -> int:
    """The iteration whose hydraplan speedup over megatron is the median: a typical one, not a cherry-pick."""
    m = outcome.result.methods
    if "megatron" not in m or "hydraplan" not in m:
        return 0
    r = outcome.result
    ratio = np.array(objective_series(r, "megatron")) / np.array(objective_series(r, "hydraplan"))
    return int(np.argsort(ratio)[len(ratio) // 2])


def plot_latency(outcome: CompareOutcome, path: Path) -> None:
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    plt = _plt()
    r = outcome.result
    fig, ax = plt.subplots(figsize=(11, 4.4))
    its = np.arange(r.iterations)
    for name in r.methods:
        if name == "hydraplan":
            continue
        ys = objective_series(r, name)
        ax.plot(its, ys, color=COLORS[name], lw=1.3, marker=".", ms=4, alpha=0.85,
                label=f"{name} ({np.mean(ys):.3g} s)")
    if "hydraplan" in r.methods:
        m = r.methods["hydraplan"]
        ys = objective_series(r, "hydraplan")
        ax.plot(its, ys, color=COLORS["hydraplan"], lw=2.0, alpha=0.6,
                label=f"hydraplan ({np.mean(ys):.3g} s)")
        names = sorted(set(m.strategies), key=m.strategies.index)
        cmap = plt.get_cmap("tab10")
        for k, s in enumerate(names):
            sel = [i for i, x in enumerate(m.strategies) if x == s]
            label = m.strategy_labels.get(s, s)
            label = label if len(label) <= 38 else label[:36] + "…"
            ax.scatter(sel, [ys[i] for i in sel], s=34, color=cmap(k % 10), edgecolor="black",
                       linewidth=0.5, zorder=5, label=f"  {s}: {label} ({len(sel)}x)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"{objective_of(r.objective)} estimate (s, log scale)")
    ax.set_title("Per-iteration latency on the same batches (hydraplan dots: the strategy it chose)\n" + _title(r),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_methods(outcome: CompareOutcome, path: Path) -> None:
    plt = _plt()
    r = outcome.result
    names = list(r.methods)
    prop = np.array([r.methods[n].mean_estimate_s for n in names])
    sync = np.array([r.methods[n].mean_sync_s or 0.0 for n in names])
    std = [float(np.std(objective_series(r, n))) for n in names]
    top = ranked(r.objective, prop, prop + sync)
    sim = [r.methods[n].mean_sim_s or 0.0 for n in names]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = np.arange(len(names))
    colors = [COLORS[n] for n in names]
    ax.bar(x - 0.2, prop, 0.4, color=colors, label="propagation (closed form)")
    ax.bar(x - 0.2, sync, 0.4, bottom=prop, color=colors, alpha=0.35, hatch="xx", edgecolor="black", linewidth=0.3,
           label="exposed sync (LNK pull/push)")
    ax.errorbar(x - 0.2, top, yerr=std, fmt="none", ecolor="black", capsize=3, lw=0.8)
    ax.bar(x + 0.2, sim, 0.4, color=colors, alpha=0.45, hatch="//", label="propagation, 1F1B simulator")
    for i, n in enumerate(names):
        sp = r.methods[n].speedup_vs_megatron
        if sp is not None:
            ax.text(i, max(prop[i] + sync[i], top[i] + std[i]), f"{sp:.2f}x", ha="center", va="bottom", fontsize=8,
                    fontweight="bold")
    ax.set_xticks(x, names, rotation=20)
    ax.set_ylabel("mean seconds / iteration")
    what = ranked(r.objective, "propagation", "end to end")
    ax.set_title(f"Mean iteration: propagation + exposed sync (error bar: std over iterations; label: speedup over "
                 f"megatron, {what})\n" + _title(r), fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_lengths(outcome: CompareOutcome, path: Path) -> None:
    plt = _plt()
    r = outcome.result
    lengths = np.minimum(outcome.dataset_lengths, r.context_len)
    edges = [0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    edges = [e for e in edges if e < r.context_len] + [r.context_len]
    idx = np.searchsorted(edges, lengths, side="left") - 1
    idx = np.clip(idx, 0, len(edges) - 2)
    seqs = np.bincount(idx, minlength=len(edges) - 1) / lengths.size
    toks = np.bincount(idx, weights=lengths, minlength=len(edges) - 1) / lengths.sum()
    labels = [f"{_k(edges[i])}-{_k(edges[i + 1])}" for i in range(len(edges) - 1)]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = np.arange(len(labels))
    ax.bar(x - 0.2, seqs * 100, 0.4, color="#1f77b4", label="share of sequences")
    ax.bar(x + 0.2, toks * 100, 0.4, color="#ff7f0e", label="share of tokens")
    maxes = [int(b.max()) for b in outcome.batches]
    ax.set_xticks(x, labels, rotation=25)
    ax.set_ylabel("% of dataset")
    ax.set_title(f"Length distribution of {r.dataset} (truncated to {r.context_len}); longest sequence per sampled "
                 f"iteration: {min(maxes)}-{max(maxes)}", fontsize=9)
    ax.legend(frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _k(v: int) -> str:
    return f"{v // 1024}K" if v >= 1024 else str(v)


def plot_load(outcome: CompareOutcome, it: int, path: Path) -> None:
    """One bar per pipeline (busy time of its micro-batches, then its pipeline bubble), per method; the
    phases of HotSPa and FlexSP run one after another and are labelled."""
    from matplotlib.patches import Patch

    plt = _plt()
    names = list(outcome.runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 1.15 * len(names) + 1.2), sharex=True)
    axes = np.atleast_1d(axes)
    top = max(outcome.runs[n].plans[it].estimate_s for n in names)
    for ax, n in zip(axes, names):
        plan = outcome.runs[n].plans[it]
        n_pipes = max(len(ph.pipelines) for ph in plan.phases)
        start = 0.0
        for ph in plan.phases:
            for k, p in enumerate(ph.pipelines):
                busy = float(p.mb_times.sum())
                ax.barh(k + 0.5, busy, left=start, height=0.85, color=COLORS[n])
                ax.barh(k + 0.5, p.latency_s - busy, left=start + busy, height=0.85, color=COLORS[n], alpha=0.3)
                if busy == 0:
                    ax.plot([start], [k + 0.5], marker="x", color="black", ms=4)
            if len(plan.phases) > 1:
                ax.axvline(start, color="black", lw=0.5, ls=":")
                if ph.latency_s > 0.18 * top:
                    ax.text(start, n_pipes * 1.02, " " + ph.label, ha="left", va="bottom", fontsize=6.5)
            start += ph.latency_s
        if plan.overhead_s:
            ax.axvspan(start, start + plan.overhead_s, color="black", alpha=0.12)
            ax.text(start + plan.overhead_s / 2, n_pipes / 2, "switching", ha="center", va="center", fontsize=7)
        ax.axvline(plan.estimate_s, color="black", lw=0.8, ls="--")
        ax.set_ylim(0, n_pipes * 1.15 + 0.2)
        ax.set_yticks([])
        ax.set_ylabel(f"{n}\n{n_pipes} pipelines", rotation=0, ha="right", va="center", fontsize=8)
        phases = f"\n  {len(plan.phases)} phases (dotted)" if len(plan.phases) > 1 else ""
        ax.text(plan.estimate_s, n_pipes * 0.5, f"  {plan.estimate_s:.2f} s, gap {outcome.result.methods[n].gap[it]:.0%}"
                + phases, va="center", fontsize=8)
        ax.set_xlim(0, top * 1.22)
    handles = [Patch(color="#555555", label="busy (sum of micro-batch times)"),
               Patch(color="#555555", alpha=0.3, label="pipeline bubble"),
               Patch(color="black", alpha=0.12, label="HotSPa switching")]
    axes[0].legend(handles=handles, fontsize=7, ncol=3, loc="lower right", frameon=False, bbox_to_anchor=(1.0, 1.05))
    axes[-1].set_xlabel("seconds (x: a pipeline with no work; dashed: the iteration's latency)")
    fig.suptitle(f"Per-pipeline load in iteration {it}, one row per pipeline\n" + _title(outcome.result), fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def slowest_pipeline(plan: bl.IterationPlan) -> bl.PipelineRun:
    return max((p for ph in plan.phases for p in ph.pipelines), key=lambda p: p.latency_s)


def gantt_pipelines(outcome: CompareOutcome, it: int) -> list[tuple[str, bl.PipelineRun]]:
    """The slowest pipeline of megatron and of hydraplan, plus, when both have a single stage, the
    slowest multi-stage pipeline any method ran in this iteration (where 1F1B has something to show)."""
    shown: list[tuple[str, bl.PipelineRun]] = [(n, slowest_pipeline(outcome.runs[n].plans[it]))
                                               for n in ("megatron", "hydraplan") if n in outcome.runs]
    if not shown:
        n = next(iter(outcome.runs))
        shown = [(n, slowest_pipeline(outcome.runs[n].plans[it]))]
    if all(p.scheme.pp == 1 for _, p in shown):
        deep = [(n, p) for n, r in outcome.runs.items() for ph in r.plans[it].phases for p in ph.pipelines
                if p.scheme.pp > 1 and p.mb_times.size]
        if deep:
            shown.append(max(deep, key=lambda x: (x[1].scheme.pp, x[1].latency_s)))
    return shown


def plot_gantt(outcome: CompareOutcome, it: int, path: Path) -> None:
    """Pipelines of `gantt_pipelines` through the 1F1B simulator, on one time axis."""
    plt = _plt()
    shown = gantt_pipelines(outcome, it)
    tls = [simulate_1f1b(p.mb_times, p.scheme.pp) for _, p in shown]
    rows = sum(p.scheme.pp for _, p in shown)
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 0.42 * rows + 1.3 * len(shown) + 0.6), sharex=True,
                             gridspec_kw={"height_ratios": [p.scheme.pp + 1.5 for _, p in shown]})
    axes = np.atleast_1d(axes)
    span = max(t.latency_s for t in tls)
    colors = {"F": plt.get_cmap("Blues"), "B": plt.get_cmap("Greens")}
    for ax, (n, p), tl in zip(axes, shown, tls):
        m = len(p.mb_times)
        for r, ivs in enumerate(tl.intervals):
            for iv in ivs:
                shade = 0.35 + 0.5 * (iv.action.mb / max(1, m - 1))
                ax.barh(r, iv.end - iv.start, left=iv.start, height=0.8, color=colors[iv.action.op](shade),
                        edgecolor="white", linewidth=0.4)
                if (iv.end - iv.start) / span > 0.025:
                    ax.text((iv.start + iv.end) / 2, r, f"{iv.action.op}{iv.action.mb}", ha="center", va="center", fontsize=6)
        ax.set_yticks(range(p.scheme.pp), [f"stage {r}" for r in range(p.scheme.pp)])
        ax.set_ylim(p.scheme.pp - 0.5, -0.5)
        ax.set_title(f"{n}: {p.scheme.label}, {m} micro-batch{'es' if m != 1 else ''}, 1F1B {tl.latency_s:.3f} s, "
                     f"closed form {p.latency_s:.3f} s, bubble {tl.bubble_ratio:.0%}", fontsize=8.5, loc="left")
    axes[-1].set_xlabel("seconds (blue: forward, green: backward; darker: later micro-batch)")
    axes[-1].set_xlim(0, span * 1.02)
    fig.suptitle(f"1F1B timeline (simulator) of the slowest pipelines, iteration {it}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def table_rows(result: CompareResult) -> list[list[str]]:
    """Per method: most used strategy, mean end-to-end estimate, its propagation and exposed sync, mean 1F1B
    simulated propagation, speedup over megatron (in the objective), mean pipeline gap, mean idle
    GPU-seconds, mean MFU."""
    rows = []
    for n, m in result.methods.items():
        e2e = "-" if m.mean_iteration_s is None else f"{m.mean_iteration_s:.3f}"
        sync = "-" if m.mean_sync_s is None else f"{m.mean_sync_s:.3f}"
        rows.append([
            n, most_common(m.strategies), e2e, f"{m.mean_estimate_s:.3f}", sync, f"{m.mean_sim_s:.3f}",
            "-" if m.speedup_vs_megatron is None else f"{m.speedup_vs_megatron:.2f}x",
            f"{np.mean(m.gap):.0%}", f"{np.mean(m.idle_gpu_s):.1f}", f"{np.mean(m.mfu):.1%}",
        ])
    return rows


TABLE_HEADER = ["method", "strategy", "iter s", "prop s", "sync s", "1F1B s", "speedup", "gap", "idle GPU·s", "MFU"]
STDOUT_COLUMNS = [0, 1, 2, 3, 4, 5, 6, 7, 9]  # the terminal table leaves idle GPU-seconds to report.html


def wlb_line(result: CompareResult) -> str | None:
    """WLB-LLM's Table 2 figures: imbalance degree (with and without the outlier queues) and delay; hydraplan's delay."""
    m, bare = result.methods.get("wlb-llm"), result.methods.get("wlb-nodelay")
    parts = []
    if m is not None and m.imbalance:
        parts.append(f"wlb-llm imbalance degree {np.mean(m.imbalance):.3f} with two queues (WLB-LLM Table 2: 1.05), "
                     f"average delay {m.avg_delay_iters_per_token:.3f} iterations per token")
    if bare is not None and bare.imbalance:
        parts.append(f"without queues {np.mean(bare.imbalance):.3f}")
    hd = result.methods.get("hydraplan-delay")
    if hd is not None and hd.avg_delay_iters_per_token is not None:
        parts.append(f"hydraplan-delay average delay {hd.avg_delay_iters_per_token:.3f} iterations per token")
    return "; ".join(parts) or None


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{path.stem}" src="data:image/png;base64,{data}">'


def render_html(result: CompareResult, images: dict[str, Path], showcase: int) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in TABLE_HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table_rows(result))
    notes = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in result.notes.items())
    descs = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(m.description)}</li>" for n, m in result.methods.items())
    wlb = wlb_line(result)
    captions = {
        "latency": f"Per-iteration {objective_of(result.objective)} estimate of every method "
                   "on the same batches.",
        "methods": "Mean iteration per method: propagation (closed form) with the exposed sync stacked on top, next to "
                   "the 1F1B timeline simulator's propagation.",
        "lengths": "Sequence and token share per length range of the dataset.",
        "load": f"Per-pipeline load in iteration {showcase} (the median hydraplan speedup).",
        "gantt": f"1F1B timelines (simulator) of the slowest pipelines in iteration {showcase}.",
    }
    figs = "".join(f"<figure>{_img(images[k])}<figcaption>{captions[k]}</figcaption></figure>" for k in PLOTS if k in images)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>hydraplan compare: {html.escape(_title(result))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; font-size: 14px; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }}
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) {{ text-align: left; }}
figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }} figcaption {{ color: #555; font-size: 13px; }}
</style></head><body>
<h1>hydraplan compare</h1>
<p>{html.escape(_title(result))}, {result.iterations} iterations, seed {result.seed}. Every method plans the
identical sampled batches and is scored with the canonical estimate of hydraplan.core.cost: <i>iter s</i> is the
end-to-end estimate, <i>prop s</i> its propagation and <i>sync s</i> the LNK pull/push that compute does not hide
(docs/formats.md formula, each method on its own schemes); <i>speedup</i> is over megatron in the
{html.escape(objective_of(result.objective))} objective, which static choices and hydraplan minimized.</p>
<table><tr>{head}</tr>{body}</table>
{f"<p>{html.escape(wlb)}</p>" if wlb else ""}
<h2>Methods</h2><ul>{descs}</ul>
<h2>Plots</h2>{figs}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""


def write_report(outcome: CompareOutcome, out: Path) -> dict[str, Path]:
    """compare.json, the PNGs and report.html into `out`; returns the written paths by name."""
    ensure_folder(out, "--out")
    write_model(out / "compare.json", outcome.result)
    it = showcase_iteration(outcome)
    images = {k: out / f"{k}.png" for k in PLOTS}
    plot_latency(outcome, images["latency"])
    plot_methods(outcome, images["methods"])
    plot_lengths(outcome, images["lengths"])
    plot_load(outcome, it, images["load"])
    plot_gantt(outcome, it, images["gantt"])
    atomic_write_text(out / "report.html", render_html(outcome.result, images, it))
    return {"compare.json": out / "compare.json", "report.html": out / "report.html", **images}
