"""Analytic profiles of Hugging Face configs (`hydraplan profiles generate --hf-config`): each GQA, vocabulary,
tying and bias term against hand computation, the bundled Llama-3.1 / Qwen2.5 profiles as the command writes
them, one-line refusals of what the cost model does not have, and pack / compare / validate on them."""

import json
from dataclasses import replace

import pytest
from helpers import hp
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.core.analytic import analytic_memory, analytic_profile, analytic_time, kv_bytes_per_token, scheme_space
from hydraplan.core.cost import model_flops
from hydraplan.core.errors import UserError
from hydraplan.core.frameworks import FRAMEWORK
from hydraplan.core.hardware import A100, H100, H200, MODELS
from hydraplan.core.hfconfig import model_spec, parse_hf_config
from hydraplan.core.kernelrates import attention_rate
from hydraplan.store.paths import DATA_DIR, PROFILES_DIR
from hydraplan.store.profiles import hf_profile, load_profile, read_hf_config

CONFIGS = DATA_DIR / "models"
LLAMA8 = CONFIGS / "llama3.1-8b.json"
FRAG = 1.15  # framework.fragmentation, written out


def spec(path=LLAMA8, **change):
    cfg = read_hf_config(path)
    return replace(model_spec(cfg, path.stem, path.stem, "test"), **change)


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


# ----------------------------------------------------------------------------------- the terms by hand
def test_llama31_8b_parameter_count_by_hand():
    h, layers, f, vocab, kv = 4096, 32, 14336, 128256, 8 * 128
    layer = h * h + h * kv + h * kv + h * h + 3 * h * f + 2 * h  # q, k, v, o, gate/up/down, two norms
    want = layers * layer + vocab * h + vocab * h + h  # untied embedding and head, final norm
    m = spec()
    assert m.params == want == 8_030_261_248
    assert abs(m.params / 8.03e9 - 1) < 0.01
    assert load_profile("h100-llama3.1-8b").model.params == want
    # tied: one vocab x h matrix fewer; QKV biases: q (h) + k and v (kv each) per layer
    assert spec(tied=True).params == want - vocab * h
    assert spec(qkv_bias=True).params == want + layers * (h + 2 * kv)


def test_kv_bytes_per_token_are_a_quarter_of_the_same_shape_mha():
    gqa, mha = spec(), spec(kv_heads=32)
    for tp in (1, 2, 4, 8):
        # every layer's K and V, 2 bytes each, 8 heads of 128 split over TP
        assert kv_bytes_per_token(gqa, tp) == pytest.approx(32 * 2 * 2 * 1024 / tp * FRAG, rel=1e-12)
        assert kv_bytes_per_token(gqa, tp) == pytest.approx(kv_bytes_per_token(mha, tp) / 4, rel=1e-12)
        m, mm = analytic_memory(gqa, tp, 1, 4, "none"), analytic_memory(mha, tp, 1, 4, "none")
        assert m.kv_bytes_per_token == pytest.approx(mm.kv_bytes_per_token / 4, rel=1e-5)
        # CP's gathered windows: (2cp+1)/(2cp) of the sequence's K/V, every layer
        assert m.token_terms["cp_kv"] == pytest.approx(32 * 4 * 1024 / tp * FRAG * 9 / 8, rel=1e-5)
        assert m.token_terms["cp_kv"] == pytest.approx(mm.token_terms["cp_kv"] / 4, rel=1e-5)
    # activations kept for the backward: K and V 2 bytes x kv_dim each instead of x hidden, per layer, / (tp cp)
    tp, cp = 2, 4
    a, b = (analytic_memory(x, tp, 1, cp, "none").token_terms for x in (gqa, mha))
    assert b["activations"] - a["activations"] == pytest.approx(32 * 4 * (4096 - 1024) / (tp * cp) * FRAG, rel=1e-5)
    assert b["backward_layer"] - a["backward_layer"] == pytest.approx(4 * (4096 - 1024) / (tp * cp) * FRAG, rel=1e-5)


def test_logits_term_grows_with_the_vocabulary():
    """pp = 1: the stage keeps every layer and the logits, 10 bytes per vocabulary entry (bf16 logits, their fp32
    copy and gradient) split over TP x CP."""
    small, big = spec(vocab=32000), spec()
    for tp, cp, mode in ((1, 1, "none"), (8, 1, "full"), (8, 8, "full")):
        a, b = (analytic_memory(m, tp, 1, cp, mode).token_terms["activations"] for m in (small, big))
        assert b - a == pytest.approx(10 * (128256 - 32000) / (tp * cp) * FRAG, rel=1e-5)
    huge = spec(vocab=256000)
    per_token = [analytic_memory(m, 8, 1, 8, "full").act_bytes_per_token for m in (small, big, huge)]
    assert per_token == sorted(per_token) and per_token[0] < per_token[2]


def test_attention_flops_follow_the_query_heads_and_gemms_the_kv_weights():
    gqa, mha = spec(), spec(kv_heads=32)
    ta, tb = analytic_time(H100, gqa, 8, 1, 1).time, analytic_time(H100, mha, 8, 1, 1).time
    # a: causal attention, forward 2*h*l^2 per layer at the kernel's forward rate, backward 2.5x at its backward rate,
    # split over TP: the same for both
    rate = attention_rate("h100")
    want = 2 * 4096 * 32 / 8 / 989.4e12 * (1 / rate.fwd_efficiency + 2.5 / rate.bwd_efficiency)
    assert ta.a == tb.a == pytest.approx(want, rel=1e-5)
    assert ta.b < tb.b  # fewer K/V weights, less rotary and no larger TP traffic
    # model FLOPs: K and V GEMMs h x kv_dim instead of h x h
    info = load_profile("h100-llama3.1-8b").model
    h, kv, f, vocab = 4096, 1024, 14336, 128256
    weights = 32 * (2 * h * h + 2 * h * kv + 3 * h * f) + vocab * h
    assert model_flops(info, 1000) == pytest.approx(6 * weights * 1000 + 6 * 32 * h * 1000**2, rel=1e-12)


def test_tp_divides_the_kv_heads():
    tps = {tp for tp, *_ in scheme_space(spec())}
    assert tps == {1, 2, 4, 8}  # 32 heads would allow 16; 8 K/V heads do not
    qwen = {tp for tp, *_ in scheme_space(spec(CONFIGS / "qwen2.5-32b.json"))}
    assert qwen == {1, 2, 4, 8}  # 40 heads, 8 K/V heads
    assert {tp for tp, *_ in scheme_space(MODELS["llama2-7b"])} == {1, 2, 4, 8, 16}


def test_gpu_memory_moves_max_len():
    """H200 (140 GiB) holds longer micro-batches than H100 (80 GiB); A100 the same memory as H100."""
    m = spec()
    h100, h200, a100 = (analytic_profile(g, m) for g in (H100, H200, A100))
    for key in ((8, 1, 1, "none"), (4, 2, 1, "full"), (8, 1, 8, "full")):
        assert h200.scheme(*key).max_len > 1.5 * h100.scheme(*key).max_len
        assert a100.scheme(*key).max_len == pytest.approx(h100.scheme(*key).max_len, rel=0.01)
        assert a100.scheme(*key).time.b > h100.scheme(*key).time.b  # a third of the peak
    assert h200.memory.capacity_bytes == pytest.approx((140 * 0.9 - 2.5) * 2**30)


# ------------------------------------------------------------------------------ command and bundled files
@pytest.mark.parametrize("stem", ["llama3.1-8b", "llama3.1-70b", "qwen2.5-32b"])
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_bundled_profiles_are_what_the_command_writes(tmp_path, stem, gpu):
    out = tmp_path / "p.json"
    r = run("profiles", "generate", "--hf-config", CONFIGS / f"{stem}.json", "--gpu", gpu, "--name", f"{gpu}-{stem}",
            "--out", out)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == (PROFILES_DIR / f"{gpu}-{stem}.json").read_bytes()
    p = json.loads(out.read_text())
    assert p["model"]["kv_heads"] == 8 and p["model"]["vocab"] in (128256, 152064)
    assert p["model"].get("qkv_bias", False) == (stem == "qwen2.5-32b") and "gqa" in p["notes"]


def test_llama2_profiles_record_no_gqa_fields():
    p = json.loads((PROFILES_DIR / "h100-llama2-7b.json").read_text())
    assert not {"kv_heads", "tied_embeddings", "qkv_bias", "rope_theta"} & set(p["model"]) and "gqa" not in p["notes"]


def test_default_name_and_a100():
    prof = hf_profile(LLAMA8, "a100")
    assert prof.name == "a100-llama3.1-8b" and prof.gpu.name == "A100-SXM-80GB" and prof.model.rope_theta == 500000


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}


def test_mixtral_is_refused_in_one_line_exit_2(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    proc = hp("profiles", "generate", "--hf-config", path, "--gpu", "h100", "--out", tmp_path / "p.json")
    assert proc.returncode == 2 and not (tmp_path / "p.json").exists()
    assert proc.stderr == (f"hydraplan: {path}: field num_local_experts: 8: mixture-of-experts (Mixtral) "
                           "is not modelled (dense LLaMA-style decoders only)\n")


@pytest.mark.parametrize("edit,field", [
    ({"num_local_experts": None, "model_type": "mistral", "architectures": None, "sliding_window": 4096},
     "field sliding_window: 4096: sliding-window attention"),
    ({"num_local_experts": None, "model_type": "qwen2", "architectures": None, "use_sliding_window": True,
      "sliding_window": 4096}, "field use_sliding_window: True: sliding-window"),
    ({"num_local_experts": None, "kv_lora_rank": 512}, "field kv_lora_rank: 512: multi-head latent attention"),
    ({"num_local_experts": None}, "field model_type: 'mixtral'"),
    ({"num_local_experts": None, "model_type": "llama", "vocab_size": None}, "field vocab_size: missing"),
    ({"num_local_experts": None, "model_type": "llama", "architectures": None, "head_dim": 64}, "field head_dim: 64"),
])
def test_unmodellable_configs_are_refused_in_one_line(tmp_path, edit, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in (MIXTRAL | edit).items() if v is not None}))
    with pytest.raises(UserError) as e:
        read_hf_config(path)
    assert str(e.value).startswith(f"{path}: {field}") and "\n" not in str(e.value)


def test_bad_gpu_and_missing_options_exit_2(tmp_path):
    r = run("profiles", "generate", "--hf-config", LLAMA8, "--gpu", "b200", "--out", tmp_path / "p.json")
    assert isinstance(r.exception, UserError) and r.exception.field == "gpu"
    assert str(r.exception) == "gpu: 'b200' is not one of h100, h200, a100, a800, h100-500w"
    r = run("profiles", "generate", "--hf-config", LLAMA8, "--out", tmp_path / "p.json")
    assert isinstance(r.exception, UserError) and str(r.exception).startswith("--hf-config needs --gpu")


def test_qwen2_config_reads_its_biases_and_mistral_is_llama():
    qwen = parse_hf_config(json.loads((CONFIGS / "qwen2.5-32b.json").read_text()), "q")
    assert qwen.qkv_bias and qwen.kv_heads == 8 and qwen.theta == 1e6  # use_sliding_window false: full attention
    mistral = parse_hf_config(MIXTRAL | {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                         "num_local_experts": None}, "m")
    assert not mistral.qkv_bias and mistral.rope_type == "default" and mistral.theta == 10000.0
    assert FRAMEWORK.fragmentation == FRAG


# --------------------------------------------------------------------------------- the usual flow on them
def test_the_readme_command(tmp_path, monkeypatch):
    """README's "Your own model": the command as written, on a config.json of one's own."""
    (tmp_path / "config.json").write_bytes(LLAMA8.read_bytes())
    monkeypatch.chdir(tmp_path)
    r = run(*"profiles generate --hf-config config.json --gpu h200 --out my-model.json".split())
    assert r.exit_code == 0 and r.output == "wrote my-model.json\n"
    mine, bundled = load_profile("my-model.json"), load_profile("h200-llama3.1-8b")
    assert mine.name == "h200-config" and mine.schemes == bundled.schemes


@pytest.mark.parametrize("name", ["h100-llama3.1-8b", "h100-llama3.1-70b"])
def test_pack_validate_and_compare_on_the_generated_profiles(tmp_path, name):
    """64 GPUs, 32K context, one 200K-token batch of prolong: the plans validate (every constraint and estimate
    recomputed from the profile), pack is no slower than Megatron on the same batch (its layout is a candidate),
    and compare's methods train exactly the sampled batch within each scheme's MaxLen."""
    import numpy as np

    from hydraplan.app.config import PackConfig
    from hydraplan.app.pack import run_pack
    from hydraplan.app.validate import validate_path
    from hydraplan.methods import compare as cp

    summary = run_pack(PackConfig(profile=name, dataset="builtin:prolong", gpus=64, tokens_per_iter=200_000,
                                  iterations=1, out=tmp_path / "run", workers=1, context_len=32768))
    report = validate_path(tmp_path / "run", load_profile(name))
    assert report.ok and report.plans == 1 and report.micro_batches > 0
    (it,) = summary.iterations
    assert summary.mean_iteration_s <= it.baselines_iteration_s["megatron"] * (1 + 1e-9)
    outcome = cp.run_compare(cp.CompareConfig(profile=name, dataset="builtin:prolong", gpus=64, tokens_per_iter=200_000,
                                              iterations=1, context_len=32768,
                                              methods=("megatron", "wlb-llm")))  # hydraplan's: pack above
    (batch,) = outcome.batches
    for method, run_ in outcome.runs.items():
        (plan,) = run_.plans
        mbs = [mb for ph in plan.phases for p in ph.pipelines for mb in p.micro_batches]
        assert sorted(plan.lengths[np.concatenate(mbs)].tolist()) == sorted(batch.tolist()), method
        for ph in plan.phases:
            for p in ph.pipelines:
                assert all(int(plan.lengths[mb].sum()) <= p.scheme.max_len for mb in p.micro_batches), method


@pytest.mark.parametrize("stem", ["llama3.1-8b", "llama3.1-70b", "qwen2.5-32b"])
def test_the_runtime_builds_each_bundled_config_with_the_profiles_parameter_count(stem):
    """`run_plan --hf-config` / `profile --hf-config` take the same configs (Llama 3.1's RoPE scaling included):
    the runtime's parameters (runtime/model.py param_specs) are the profile's model.params."""
    from hydraplan.runtime.hf import model_config
    from hydraplan.runtime.model import param_specs

    cfg = model_config(str(CONFIGS / f"{stem}.json"))
    assert cfg.kv_heads == 8 and cfg.qkv_bias == (stem == "qwen2.5-32b")
    assert (cfg.rope_scaling is not None) == stem.startswith("llama")
    assert sum(s.numel for s in param_specs(cfg)) == load_profile(f"h100-{stem}").model.params
