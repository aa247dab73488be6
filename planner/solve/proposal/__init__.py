"""Distribution-aware strategy proposal (Hydraulis §7): the interval DP of Eq. (4), its continuous
relaxation, rounding to integer strategies, and the homogeneous fallback.

Cost model (the canonical estimate of docs/formats.md, taken in expectation over the dataset). The length
distribution, truncated to the context length L, is scaled to a nominal batch of `tokens_per_iter` tokens
(default 4096 per GPU), so a length bin holds a fractional expected number of sequences. Lengths are
binned on a 128-token grid; empty bins merge into the next non-empty one (an adaptive grid that is never
coarser than 128 tokens where data exists) and the last cell ends at L. An interval of cells run by d
pipelines of scheme P costs

    latency = max(W / d + B, F),    W = sum_seq (a*l^2 + b*l) + c * MB,    B = (pp - 1) * t(longest micro-batch),
                                    F = pp * T(l_max, P)

Micro-batch model, the packer's (solve/packing.py): on pp=1 every packing into V micro-batches costs
S + V*c, so the packer fills them to MaxLen and a sequence of length l adds l/MaxLen micro-batches (MB).
On pp>1 more micro-batches shrink the bubble: sequences shorter than UtilLen(P) are packed into
UtilLen-token micro-batches, longer ones run alone, so a sequence adds min(l, UtilLen)/UtilLen micro-batches
and the longest micro-batch of an interval with longest sequence l_max holds m = max(l_max, UtilLen) tokens
of such sequences: t = a*l_max*m + b*m + c, which is T(l_max, P) whenever l_max >= UtilLen. W is split over the
d pipelines; the bubble B is not. Nor is a sequence: the pipeline holding the interval's longest one takes
at least its micro-batch alone, F = pp * T(l_max, P) (sum + (pp-1)*max >= pp*max). Without this floor a
pp=1 interval's longest sequence would cost only its share of W, and the long tail would go to many narrow
pipelines on which one long sequence alone outlasts the iteration. The DP's value is the iteration
latency of the nominal batch (restricted to lengths <= L'); `expected_s_per_token` divides it by that
batch's tokens.

Algorithms. Eq. (4) minimises the largest interval latency subject to sum(d * GPUs) <= N. For a target
latency tau an interval needs F <= tau and d = ceil(W / (tau - B)) pipelines, so the fewest GPUs that
meet tau is a shortest path over cell boundaries; t[N][L] is the smallest tau whose path fits in N GPUs
(bisection). This computes exactly Eq. (4) with O(M^2 K) work per probe instead of a table over every
n <= N. In the continuous relaxation (fractional n and d) d = W / (tau - B) where F <= tau, and splitting
an interval never hurts (the lower part's bubble and floor are no larger), so every cell takes its own
cheapest scheme and t[N][L'] for every L' comes from one bisection vectorised over L' and cells.
Rounding (paper Fig. 12: "rounding requires scaling"): each scheme keeps its cells, and on d instead of x
fractional pipelines a cell finishes at max(B + (tau - B) * x / d, F); the integer d per scheme
minimising the largest such latency within N GPUs is found exactly (it covers every floor/ceil
combination of x), schemes holding under one pipeline may be dropped (their cells move, if need be to a
scheme whose floor exceeds tau), and leftover GPUs go to the slowest scheme that fits. The best rounding
per L' is the optimum for L'; the candidates are their union, plus the integer optimum for L and the
homogeneous fallback.

Objective (docs/formats.md, "End-to-end estimate"). With the end-to-end objective every latency above is
an iteration time: a pipeline of scheme k with propagation p > 0 takes f_k(p) = max(2 t_k, t_k + 2p/3, p),
t_k its one-direction LNK transfer (core/sync.py), so many narrow pipelines pay for their large parameter
slices. f_k is increasing, so a budget tau on iteration time is the budget g_k(tau) = min(tau, 1.5 (tau -
t_k)) on scheme k's propagation (no pipeline of k meets tau < 2 t_k): every probe, bisection and rounding
step above runs unchanged on per-scheme budgets g_k(tau) and reports f_k of the latencies it reaches, and
dominance between schemes also requires no larger t. The propagation objective is t = 0 (f and g identity).

Modules: cells (the cell costs and the homogeneous fallback), integer (Eq. (4)), relaxed (its relaxation),
rounding, candidates (the entry, `propose`, and `strategy_label`).
"""

from hydraplan.solve.proposal.candidates import TOKENS_PER_GPU, propose, strategy_label
from hydraplan.solve.proposal.cells import LENGTH_STEP, CellCosts, best_homogeneous, build_cells
from hydraplan.solve.proposal.integer import IntegerSolution, solve_integer
from hydraplan.solve.proposal.relaxed import RelaxedSolution, solve_relaxed
from hydraplan.solve.proposal.rounding import round_relaxed

__all__ = ["CellCosts", "IntegerSolution", "RelaxedSolution", "build_cells", "solve_integer", "solve_relaxed",
           "round_relaxed", "best_homogeneous", "propose", "strategy_label", "LENGTH_STEP", "TOKENS_PER_GPU"]
