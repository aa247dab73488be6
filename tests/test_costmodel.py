"""The analytic cost model and the bundled profiles: physical properties, Hydraulis anchors, fitting."""

import numpy as np
import pytest
from helpers import HYDRAULIS_MAX_LEN, HYDRAULIS_TIME

from hydraplan.core.analytic import (
    CP_DEGREES,
    MIN_MAX_LEN,
    REFERENCE_GPUS,
    analytic_memory,
    analytic_profiles,
    capacity_bytes,
    kv_bytes_per_token,
    scheme_space,
)
from hydraplan.core.cluster import for_gpus, max_len_for_gpus, max_len_from_memory
from hydraplan.core.cost import mfu, micro_batch_times, model_flops, seq_time, steady_state_mfu, util_len
from hydraplan.core.fit import fit_time_coeffs
from hydraplan.core.frameworks import FRAMEWORK
from hydraplan.core.hardware import A800, H100, MODELS
from hydraplan.schema import GPUInfo, ModelInfo, Profile, Scheme, TimeCoeffs
from hydraplan.store.fileio import load_model, model_json, parse_model, write_model
from hydraplan.store.profiles import load_profile

NAMES = [f"{g}-llama2-{m}{d}" for g, dtypes in (("h100", ("", "-fp8")), ("a800", ("",))) for m in ("7b", "13b", "32b")
         for d in dtypes]


@pytest.fixture(scope="module")
def profiles() -> dict[str, Profile]:
    return {name: load_profile(name) for name in NAMES}


def test_bundled_profiles_round_trip(profiles, tmp_path):
    for name, p in profiles.items():
        again = parse_model(Profile, p.model_dump(by_alias=True), name)
        assert again == p
        write_model(tmp_path / f"{name}.json", p)
        assert load_model(Profile, tmp_path / f"{name}.json") == p
        assert model_json(load_model(Profile, tmp_path / f"{name}.json")) == model_json(p)


def test_bundled_files_are_what_the_generator_writes(profiles):
    """The committed profiles must be regenerated whenever planner/core/hardware.py or the model changes."""
    generated = {p.name: p for p in analytic_profiles()}
    assert sorted(generated) == sorted(NAMES)
    for name, p in profiles.items():
        assert model_json(generated[name]) == model_json(p), f"{name} is stale: run `hydraplan profiles generate`"


def test_scheme_space_and_constants_are_documented(profiles):
    for p in profiles.values():
        heads = p.model.heads
        for s in p.schemes:
            assert s.tp in (1, 2, 4, 8, 16) and heads % s.tp == 0
            assert p.model.layers % s.pp == 0 and s.pp <= 8
            assert s.cp in CP_DEGREES and (s.gpus <= 64 if s.cp <= 8 else s.pp == 1 and s.gpus <= 512)
            assert s.memory is not None and 1 <= s.util_len <= s.max_len
        assert {s.key[:3] for s in p.schemes if s.recompute == "full"} >= {s.key[:3] for s in p.schemes}
        for key in ("gpu.peak_tflops", "gpu.ib", "links", "capacity", "framework.activations", "framework.unsplit",
                    "framework.recompute_time", "framework.context_parallel", "fit_worst_rel_err", "model"):
            assert p.notes.get(key), f"{p.name}: note {key} missing"
    assert profiles["a800-llama2-13b"].scheme(16, 1, 1) is None  # 40 heads: TP=16 impossible
    assert profiles["a800-llama2-32b"].scheme(8, 1, 1) is not None


def test_stored_max_len_is_the_reference_recomputation(profiles):
    for p in profiles.values():
        assert p.reference_gpus == REFERENCE_GPUS == 64
        for s in p.schemes:
            assert s.max_len == max_len_for_gpus(p, s, 64) >= MIN_MAX_LEN


def test_time_grows_with_length(profiles):
    for p in profiles.values():
        for s in p.schemes:
            l = np.unique(np.geomspace(1, s.max_len, 200).astype(np.int64))
            t = np.array([seq_time(s, x) for x in l])
            assert np.all(np.diff(t) > 0), s.label


@pytest.mark.parametrize("model", list(MODELS))
def test_max_len_grows_with_tp_cp_and_cluster_size(model):
    m = MODELS[model]
    cap = capacity_bytes(A800)
    space = scheme_space(m)
    ml = {k: max_len_from_memory(cap, analytic_memory(m, *k), 64) for k in space}
    for (tp, pp, cp, mode), v in ml.items():
        for bigger in ((2 * tp, pp, cp, mode), (tp, pp, 2 * cp, mode)):
            if bigger in ml and v > 0:
                assert ml[bigger] > v, f"{model} {bigger} vs {(tp, pp, cp, mode)}"
        mem = analytic_memory(m, tp, pp, cp, mode)
        by_n = [max_len_from_memory(cap, mem, n) for n in (8, 16, 64, 256, 1024)]
        assert by_n == sorted(by_n)
        if by_n[-1] > 0:
            assert by_n[-1] > by_n[0]


def mfu_peak_lengths(p: Profile, s: Scheme) -> np.ndarray:
    """The lengths in 1..MaxLen where the implied MFU can be largest. It is N(l)/D(l) with N = x l + y l^2 (model
    FLOPs) and D = a l^2 + b l + c (the time), whose derivative has the sign of (y b - x a) l^2 + 2 y c l + x c:
    the largest value over the integers is at an end or next to a real root of that quadratic. (Evaluating all
    of 1..MaxLen, up to 12M lengths for each of 1,300 schemes, took minutes.)"""
    f1, f2 = model_flops(p.model, [1, 2])
    y = (f2 - 2 * f1) / 2
    x = f1 - y
    a, b, c = s.time.a, s.time.b, s.time.c
    roots = np.roots([y * b - x * a, 2 * y * c, x * c]) if y * b != x * a else np.array([-x / (2 * y)])
    near = [np.floor(r.real) + d for r in roots if abs(r.imag) < 1e-9 for d in (0, 1)]
    return np.unique(np.clip([1, s.max_len, *near], 1, s.max_len)).astype(np.int64)


def test_no_scheme_beats_the_physical_limit(profiles):
    """Implied MFU < 70% of the GEMMs' dtype peak at every length 1..MaxLen (MFU is stated against the bf16 peak,
    fp8's is twice it), and the best scheme is not absurdly slow either."""
    rng = np.random.default_rng(0)
    for p in profiles.values():
        scale = 2.0 if p.dtype == "fp8" else 1.0
        best_4k = 0.0
        for s in p.schemes:
            top = steady_state_mfu(p, s, mfu_peak_lengths(p, s)).max()
            sample = steady_state_mfu(p, s, rng.integers(1, s.max_len + 1, 2000))  # none above the peak found
            assert sample.max() <= top * (1 + 1e-12), f"{p.name} {s.label}: a length beats the peak lengths"
            assert top < 0.70 * scale, f"{p.name} {s.label}: MFU {top:.3f}"
            if s.max_len >= 4096:
                best_4k = max(best_4k, float(steady_state_mfu(p, s, [4096])[0]))
        assert 0.3 < best_4k < 0.70 * scale, p.name


def test_hydraulis_anchors(profiles):
    """Time coefficients of the shipped profile within 2x of the paper's fits, and MaxLen without recomputation
    within 20% of Hydraulis' at TP 2-16; the profile's notes give each deviation and what explains it."""
    p = profiles["a800-llama2-7b"]
    for key, ref in HYDRAULIS_TIME.items():
        t = p.scheme(*key).time
        for ours, theirs in zip((t.a * 1e3, t.b * 1e3, t.c * 1e3), ref):
            assert 0.5 <= ours / theirs <= 2.0, (key, ours, theirs)
    note = p.notes["max_len_vs_hydraulis"]
    for key, ref in HYDRAULIS_MAX_LEN.items():
        ours = p.scheme(*key).max_len
        assert 0.8 <= ours / ref <= 1.2, (key, ours, ref)
        assert f"<{key[0]},1,1> {ours:,} vs {ref:,}" in note


def test_sequence_parallelism_divides_activations_by_tp_times_cp():
    """With SP every kept activation is split by TP x CP (appendix C.1); what SP leaves unsplit is split by CP; a CP
    rank's gathered K/V windows (the runtime's CP) by TP only, all layers' of them, or one layer's under full
    recomputation."""
    m = MODELS["llama2-7b"]
    base = analytic_memory(m, 1, 1, 1).token_terms
    for tp, cp in ((2, 1), (8, 1), (4, 4), (1, 8), (8, 64)):
        for mode in ("none", "full"):
            terms = analytic_memory(m, tp, 1, cp, mode).token_terms
            ref = analytic_memory(m, 1, 1, 1, mode).token_terms
            for name in ("activations", "backward_layer"):
                assert terms[name] == pytest.approx(ref[name] / (tp * cp), rel=1e-5), (tp, cp, name)
            assert terms["sp_unsplit"] == pytest.approx(base["sp_unsplit"] / cp, rel=1e-5)
            kv = kv_bytes_per_token(m, tp) * (2 * cp + 1) / (2 * cp) / (m.layers if mode == "full" else 1)
            assert terms.get("cp_kv", 0.0) == (pytest.approx(kv, rel=1e-5) if cp > 1 else 0.0), (tp, cp, mode)


@pytest.mark.parametrize("name", ["h100-llama2-7b", "a800-llama2-13b"])
def test_recomputation_trades_time_for_memory(profiles, name):
    """Every layout has a scheme per mode: each mode holds longer micro-batches and costs more than the one before;
    full recomputation re-runs the layers' forward, a quarter to a half more than no recomputation at long
    micro-batches, selective only elementwise work (a few percent)."""
    p = profiles[name]
    by = {s.key: s for s in p.schemes}
    checked = 0
    for (tp, pp, cp, mode), s in by.items():
        if mode != "none" or (tp, pp, cp, "full") not in by:
            continue
        sel, full = by.get((tp, pp, cp, "selective")), by[(tp, pp, cp, "full")]
        assert sel is not None and s.max_len < sel.max_len < full.max_len, s.label
        l = min(s.max_len, 8192) if cp == 1 else s.max_len  # CP schemes: a length every mode's fit covers
        t = [seq_time(x, l) for x in (s, sel, full)]
        assert t[0] < t[1] < t[2], s.label
        if cp == 1:
            assert t[1] / t[0] < 1.05 and 1.25 < t[2] / t[0] < 1.5, (s.label, t)
        checked += 1
    assert checked > 50


def test_the_cp_ring_hides_behind_long_attention():
    """CP 16 across nodes: the K/V ring is exposed for a short sequence and hidden behind a long one's attention, so
    T(l) per token sits near the closed-form terms at MaxLen and above them at MaxLen/16, where the fit starts; the fit
    only adds nonnegative increments to the closed form (fitted as the profile fits it: up to the layout's MaxLen with
    full recomputation)."""
    from hydraplan.core.stagetime import StageSpec, closed_form, ring_exposed, stage_time, totals

    m = MODELS["llama2-7b"]
    spec = StageSpec(H100, m, FRAMEWORK, 8, 1, 16)
    short, long_ = np.array([4096.0]), np.array([4_000_000.0])
    exposed = [float(ring_exposed(spec, x)[0]) for x in (short, long_)]
    assert exposed[0] > 0 and exposed[1] == 0
    ml, hi = (max_len_from_memory(capacity_bytes(H100), analytic_memory(m, 8, 1, 16, mode), 128) for mode in ("none", "full"))
    st = stage_time(spec, (ml // 16, hi))
    a, b, c = totals(closed_form(spec))
    t = st.time
    assert t.a >= a * (1 - 1e-5) and t.b >= b * (1 - 1e-5) and t.c >= c * (1 - 1e-5)  # floors the fit keeps
    assert set(t.c_terms or {}) >= {"cp_ring_exposed"}
    s = Scheme(tp=8, pp=1, cp=16, max_len=ml, util_len=1, time=t)
    assert 0 < st.fit_rel_err < 0.6
    assert seq_time(s, ml) == pytest.approx((a * ml + b) * ml + c, rel=0.15)
    ring = float(ring_exposed(spec, np.array([ml / 16.0]))[0])
    assert ring > 0 and seq_time(s, ml / 16) > (a * ml / 16 + b) * ml / 16 + c


def test_util_len_is_the_first_length_at_85_percent():
    time = TimeCoeffs(a=1e-9, b=1e-4, c=0.03)
    u = util_len(time, 10**6)
    eff = lambda l: time.b * l / (time.b * l + time.c)  # noqa: E731
    assert eff(u) >= 0.85 > eff(u - 1)
    assert util_len(time, 500) == 500  # capped at MaxLen


def test_for_gpus_caps_util_len_at_the_new_max_len(profiles):
    p = profiles["a800-llama2-32b"]  # 16 B/param of optimizer states and owner gradient: 16 GPUs are its smallest
    view = for_gpus(p, 16)
    assert view.schemes and all(s.util_len <= s.max_len for s in view.schemes)
    assert all(s.gpus <= 16 for s in view.schemes)


def test_model_flops_and_mfu_by_hand():
    model = ModelInfo(name="m", layers=1, hidden=2, ffn=3, vocab=5)
    # GEMM weights: 4*2*2 + 3*2*3 + 5*2 = 44; attention 6 * layers * h * l^2 = 12 l^2
    assert model_flops(model, [1, 2]).tolist() == [6 * 44 + 12, 6 * 44 * 2 + 48]
    p = Profile(name="t", gpu=GPUInfo(name="g", memory_gib=1, peak_tflops=1e-9), model=model,
                schemes=[Scheme(tp=2, pp=1, cp=1, max_len=8, util_len=1, time=TimeCoeffs(a=0, b=1, c=0))])
    # 276 + 576 FLOPs in 2 s on 2 GPUs of 1000 FLOP/s
    assert mfu(p, p.schemes[0], [1, 2], 2.0) == pytest.approx((276 + 576) / (2 * 2 * 1000))


def test_fit_recovers_known_coefficients_from_noisy_timings():
    rng = np.random.default_rng(7)
    a, b, c = 2.0e-9, 9.7e-5, 0.065
    l = np.repeat(np.geomspace(128, 65536, 24), 3)
    exact = (a * l + b) * l + c
    fit = fit_time_coeffs(l, exact)
    assert fit.a == pytest.approx(a, rel=1e-8) and fit.b == pytest.approx(b, rel=1e-8)
    assert fit.c == pytest.approx(c, rel=1e-8) and fit.worst_rel_err < 1e-8 and fit.r2 == pytest.approx(1.0)
    noisy = exact * (1 + rng.normal(0, 0.02, l.size))
    fit = fit_time_coeffs(l, noisy)
    assert fit.a == pytest.approx(a, rel=0.1) and fit.b == pytest.approx(b, rel=0.1)
    assert fit.c == pytest.approx(c, rel=0.1)
    assert fit.r2 > 0.99 and fit.worst_rel_err < 0.1


def test_fit_is_the_nonnegative_optimum():
    """Timings whose unconstrained fit wants c < 0: the fit clamps it and satisfies the NNLS KKT conditions."""
    rng = np.random.default_rng(3)
    l = np.geomspace(64, 32768, 30)
    y = 1e-4 * l - 0.002 + 1e-9 * l * l
    y = y[y > 0] * (1 + rng.normal(0, 0.01, (y > 0).sum()))
    l = l[-y.size:]
    fit = fit_time_coeffs(l, y)
    coef = np.array([fit.a, fit.b, fit.c])
    assert np.all(coef >= 0) and fit.c == 0.0
    X = np.column_stack([l * l, l, np.ones_like(l)]) / y[:, None]
    grad = X.T @ (X @ coef - 1)  # gradient of the relative squared error
    scale = np.abs(X).max(axis=0) * np.sqrt(l.size)
    for i in range(3):
        if coef[i] > 0:
            assert abs(grad[i]) / scale[i] < 1e-6
        else:
            assert grad[i] / scale[i] > -1e-6
    # and no random nonnegative neighbour does better
    base = float(((X @ coef - 1) ** 2).sum())
    for _ in range(200):
        trial = np.maximum(coef * rng.uniform(0.95, 1.05, 3) + rng.uniform(-1, 1, 3) * [1e-12, 1e-7, 1e-4], 0)
        assert float(((X @ trial - 1) ** 2).sum()) >= base - 1e-12


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="equally many"):
        fit_time_coeffs([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        fit_time_coeffs([1, 2, 3], [1.0, 0.0, 2.0])


def test_micro_batch_times_is_each_micro_batch_summed_on_its_own():
    """One vectorized pass over all micro-batches (empty ones included) gives what summing each alone gives."""
    rng = np.random.default_rng(4)
    s = Scheme(tp=1, pp=2, cp=1, max_len=4096, util_len=512, time=TimeCoeffs(a=3e-9, b=2e-5, c=0.01))
    lengths = rng.integers(1, 4096, 500)
    cuts = np.sort(rng.integers(0, 500, 40))
    order = rng.permutation(500)
    mbs = [order[a:b] for a, b in zip(np.r_[0, cuts], np.r_[cuts, 500])] + [np.zeros(0, dtype=np.int64)]
    want = [sum((s.time.a * float(l) + s.time.b) * float(l) for l in lengths[g]) + s.time.c for g in mbs]
    got = micro_batch_times(s, lengths, mbs)
    assert got.shape == (len(mbs),)
    assert got == pytest.approx(want, rel=1e-12)
    assert got[-1] == s.time.c and micro_batch_times(s, lengths, []).size == 0
