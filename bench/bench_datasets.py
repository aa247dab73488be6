"""Dataset loading and sampling speed on the 1M-document wikipedia lengths (issue 2: well under a second).

Sampling is also run through a one-sequence-at-a-time Python loop over the same permutations, to
report the vectorized path as a ratio measured in the same run and to check both give the same batches.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.run import Run
from hydraplan.core.lengthstats import summarize
from hydraplan.store.datasets import load_dataset, sample_iterations

CONTEXT, BUDGET, SEED = 32768, 200_000, 0


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def python_loop_sampling(lengths: np.ndarray, iterations: int) -> list[list[int]]:
    """The reference rule, one sequence at a time: take documents until the budget is reached."""
    batches: list[list[int]] = []
    epoch, order, pos, batch, tokens = 0, np.random.default_rng([SEED, 0]).permutation(lengths.size), 0, [], 0
    while len(batches) < iterations:
        if pos == lengths.size:
            epoch, pos = epoch + 1, 0
            order = np.random.default_rng([SEED, epoch]).permutation(lengths.size)
        doc = int(order[pos])
        pos += 1
        batch.append(doc)
        tokens += int(lengths[doc])
        if tokens >= BUDGET:
            batches.append(batch)
            batch, tokens = [], 0
    return batches


def main(run: Run) -> None:
    iters, repeats = run.pick(1000, 20), run.pick(3, 1)
    rows: dict[str, float] = {}
    load_wiki = lambda: load_dataset("builtin:wikipedia", CONTEXT)  # noqa: E731
    rows["load_wikipedia_histogram"], wiki = best_of(load_wiki, repeats)
    with tempfile.TemporaryDirectory() as tmp:
        lengths = np.random.default_rng(1).permutation(wiki.lengths)
        np.savetxt(Path(tmp) / "w.txt", lengths, fmt="%d")
        np.save(Path(tmp) / "w.npy", lengths)
        rows["load_lengths_txt"], _ = best_of(lambda: load_dataset(Path(tmp) / "w.txt", CONTEXT), repeats)
        rows["load_lengths_npy"], raw = best_of(lambda: load_dataset(Path(tmp) / "w.npy", CONTEXT), repeats)
    # A new Dataset object per repeat: nothing cached from the previous run.
    rows["load_and_sample"], batches = best_of(lambda: sample_iterations(load_wiki(), BUDGET, iters, SEED), repeats)
    fresh = [load_wiki() for _ in range(repeats)]
    rows["sample"], batches = best_of(
        lambda: sample_iterations(fresh.pop(), BUDGET, iters, SEED), repeats)
    fresh = [load_wiki() for _ in range(repeats)]
    rows["resume_last_10"], _ = best_of(
        lambda: sample_iterations(fresh.pop(), BUDGET, 10, SEED, start=iters - 10), repeats)
    rows["python_loop_sample"], ref = best_of(lambda: python_loop_sampling(wiki.lengths, iters), 1)
    rows["stats"], _ = best_of(lambda: summarize(raw.lengths, dataset="w"), repeats)
    same = all(b.lengths.tolist() == wiki.lengths[r].tolist() for b, r in zip(batches, ref))
    speedup = rows["python_loop_sample"] / rows["sample"]
    sampled = sum(b.ids.size for b in batches)
    out = {
        "dataset": "builtin:wikipedia", "documents": int(wiki.lengths.size), "context_len": CONTEXT,
        "tokens_per_iter": BUDGET, "iterations": iters, "repeats": repeats, "sequences_sampled": sampled,
        "seconds": rows, "vectorized_speedup_vs_python_loop": speedup, "same_batches_as_python_loop": same,
    }
    run.write(out)
    for name, secs in rows.items():
        print(f"{name:44s} {secs * 1000:9.1f} ms")
    print(f"vectorized sampling is {speedup:.0f}x the Python loop ({sampled:,} sequences); same batches: {same}")
