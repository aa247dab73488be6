"""The analytic cost model and the bundled profiles: physical properties, Hydraulis anchors, fitting."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import HYDRAULIS_MAX_LEN, HYDRAULIS_TIME, max_len_with_sequence_parallelism

from hydraplan.core.analytic import MIN_MAX_LEN, REFERENCE_GPUS, analytic_memory, analytic_profiles, capacity_bytes, scheme_space
from hydraplan.core.cluster import for_gpus, max_len_for_gpus, max_len_from_memory
from hydraplan.core.cost import mfu, model_flops, seq_time, steady_state_mfu, util_len
from hydraplan.core.fit import fit_time_coeffs
from hydraplan.core.hardware import A800, FRAMEWORK, MODELS
from hydraplan.schema import GPUInfo, ModelInfo, Profile, Scheme, TimeCoeffs
from hydraplan.store.fileio import load_model, model_json, parse_model, write_model
from hydraplan.store.profiles import load_profile

NAMES = [f"{g}-llama2-{m}" for g in ("h100", "a800") for m in ("7b", "13b", "32b")]


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
            assert s.cp in (1, 2, 4, 8) and s.gpus <= 64
            assert s.memory is not None and 1 <= s.util_len <= s.max_len
        for key in ("gpu.peak_tflops", "gpu.ib", "links", "capacity", "framework.activations", "model"):
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
    for (tp, pp, cp), v in ml.items():
        for bigger in ((2 * tp, pp, cp), (tp, pp, 2 * cp)):
            if bigger in ml and v > 0:
                assert ml[bigger] > v, f"{model} {bigger} vs {(tp, pp, cp)}"
        mem = analytic_memory(m, tp, pp, cp)
        by_n = [max_len_from_memory(cap, mem, n) for n in (8, 16, 64, 256, 1024)]
        assert by_n == sorted(by_n)
        if by_n[-1] > 0:
            assert by_n[-1] > by_n[0]


def test_no_scheme_beats_the_physical_limit(profiles):
    """Implied MFU < 70% at every length 1..MaxLen, and the best scheme is not absurdly slow either."""
    for p in profiles.values():
        best_4k = 0.0
        for s in p.schemes:
            u = steady_state_mfu(p, s, np.arange(1, s.max_len + 1))
            assert u.max() < 0.70, f"{p.name} {s.label}: MFU {u.max():.3f}"
            if s.max_len >= 4096:
                best_4k = max(best_4k, float(u[4095]))
        assert 0.3 < best_4k < 0.70, p.name


def test_hydraulis_anchors_within_2x(profiles):
    """Time coefficients of the shipped profile, and the memory formula WITH sequence parallelism (which
    Hydraulis' system has: its MaxLen grows ~linearly with TP), land within 2x of the paper's fits."""
    p = profiles["a800-llama2-7b"]
    for key, ref in HYDRAULIS_TIME.items():
        t = p.scheme(*key).time
        for ours, theirs in zip((t.a * 1e3, t.b * 1e3, t.c * 1e3), ref):
            assert 0.5 <= ours / theirs <= 2.0, (key, ours, theirs)
    for key, ref in HYDRAULIS_MAX_LEN.items():
        max_len = max_len_with_sequence_parallelism(*key)
        assert 0.5 <= max_len / ref <= 2.0, (key, max_len, ref)


def test_no_sequence_parallelism_replicates_norm_and_gemm_inputs():
    """The shipped model (no SP, like the runtime): per layer, act_h_replicated * h bytes per token stay whole
    on every TP rank, so activation bytes per token shrink less than 1/TP, and they equal the SP formula's at
    TP = 1."""
    m = MODELS["llama2-7b"]
    per_layer = {tp: analytic_memory(m, tp, 1, 1).act_bytes_per_token for tp in (1, 2, 8)}
    replicated = (m.layers + 1) * FRAMEWORK.act_h_replicated * m.hidden * FRAMEWORK.fragmentation
    for tp in (2, 8):
        split = per_layer[tp] - replicated
        assert split == pytest.approx((per_layer[1] - replicated) / tp, rel=1e-5)
    with_sp = replace(FRAMEWORK, act_h_replicated=0, act_h=FRAMEWORK.act_h + FRAMEWORK.act_h_replicated)
    assert analytic_memory(m, 1, 1, 1, with_sp).act_bytes_per_token == pytest.approx(per_layer[1], rel=1e-5)
    assert analytic_memory(m, 8, 1, 1, with_sp).act_bytes_per_token < per_layer[8] / 2


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
