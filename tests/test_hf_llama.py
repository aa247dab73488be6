"""The runtime against Hugging Face transformers' LlamaForCausalLM and Qwen2ForCausalLM (grouped-query attention,
Qwen2's QKV biases, Llama 3.1's RoPE scaling) holding the same weights (fp64, packed documents with per-document position_ids,
use_cache=False): logits, loss and every gradient within 1e-10, on one rank and through the replay path on four
ranks with TP, PP and CP. The weights travel the way a user's
would: save_pretrained (config.json + safetensors), then runtime/hf.py's loader.

transformers computes its RoPE cos/sin tables (LlamaRotaryEmbedding) and its RMSNorm statistics (LlamaRMSNorm)
in fp32 whatever the model dtype, which makes fp64 logits differ by ~1e-7; `fp64_hf` evaluates those two
modules' own formulas in fp64, the only change to the model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import free_port, make_plan
from ranks import spawn

from hydraplan.core.errors import UserError
from hydraplan.core.hfconfig import model_spec, parse_hf_config
from hydraplan.runtime import hf
from hydraplan.runtime.batches import IGNORE, TokenData, micro_batch_seqs
from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.model import ModelConfig, StageModule, load_full, param_specs, rope_tables
from hydraplan.schema import BatchSeq

transformers = pytest.importorskip("transformers")
DT = torch.float64
DOCS = [5, 9, 1, 3]


ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}


def hf_model(folder: Path, tied: bool = False, shard: str | None = None, arch: str = "llama", **extra):
    """A tiny Llama (or Qwen2: QKV biases) with grouped-query attention, non-trivial norm weights and biases,
    saved to `folder`."""
    config_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    cfg = config_cls(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=tied, **extra)
    torch.manual_seed(0)
    model = model_cls(cfg).to(DT)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.1 if name.endswith("norm.weight") else 0.05) + name.endswith("norm.weight"))
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return fp64_hf(model.eval())


def fp64_hf(model, inv_freq: torch.Tensor | None = None):
    """HF's RoPE (cos/sin of positions x inv_freq, by default 1/theta^(2i/D)) and RMSNorm (x / sqrt(mean(x^2) + eps)
    * w) evaluated in the model's dtype instead of fp32."""
    cfg = model.config
    theta, dim = cfg.rope_parameters["rope_theta"], cfg.hidden_size // cfg.num_attention_heads
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=DT) / dim))

    def rope(x, position_ids):
        freqs = position_ids[..., None].to(DT) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rms(norm):
        return lambda x: norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    model.model.rotary_emb.forward = rope
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = rms(m)
    return model


@pytest.fixture(scope="module", params=list(ARCHS))
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return folder, hf_model(folder, arch=request.param)


def runtime_logits(mod: StageModule, mb) -> torch.Tensor:
    """The full-vocab logits of a single-stage, single-rank module (its forward returns the loss)."""
    x = mod.embed(mb.tokens)
    cos, sin = rope_tables(mb.positions, mod.cfg.head_dim, mod.cfg.rope_theta, mod.dtype, mod.cfg.rope_scaling)
    for block in mod.layers.values():
        x = block(x, cos, sin, mb)
    return F.linear(mod.norm(x), mod.head.weight)


def hf_forward(model, mb) -> torch.Tensor:
    out = model(input_ids=mb.tokens[None], position_ids=mb.positions[None], use_cache=False).logits[0]
    return out


def hf_grads(model, cfg: ModelConfig, tied: bool = False) -> list[torch.Tensor]:
    """HF gradients in the canonical layout (o_proj and down_proj transposed)."""
    named = dict(model.named_parameters())
    out = []
    for s in param_specs(cfg):
        name, transposed = hf.hf_name(s.name, tied)
        g = named[name].grad
        out.append(g.T if transposed else g)
    return out


def test_config_json_becomes_the_model(saved):
    folder, _ = saved
    cfg, tied = hf.read_config(folder)
    assert cfg == ModelConfig(f"hf:{folder.name}", vocab=128, hidden=32, layers=4, heads=4, kv_heads=2, ffn=64,
                              rope_theta=10000.0, norm_eps=1e-5, qkv_bias=folder.name.startswith("qwen2"))
    assert not tied
    # the runtime's parameters are transformers', and the analytic cost model counts the same (biases included)
    _, model = saved
    runtime = sum(s.numel for s in param_specs(cfg))
    assert runtime == sum(p.numel() for p in model.parameters())
    spec = model_spec(parse_hf_config(json.loads((folder / "config.json").read_text()), "c"), "k", "k", "s")
    assert spec.params == runtime


def test_run_plan_and_profile_take_the_model_from_a_config_json(saved, tmp_path, monkeypatch, capsys):
    """run_plan --hf-config FILE: seeded weights for the config's model (GQA, Qwen2's biases), equal to the
    single-process reference; profile's --model takes a config.json path and checks layouts against its K/V heads."""
    from hydraplan.app.cmd_profile import _schemes_to_measure
    from hydraplan.runtime.run_plan import main
    from hydraplan.store.fileio import write_model

    folder, _ = saved
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    plan = make_plan(0, "S", [(1, 1, [0], [[5, 9], [4]])], gpus=1)
    write_model(tmp_path / "plan.json", plan)
    config = str(folder / "config.json")
    assert main([str(tmp_path / "plan.json"), "--hf-config", config, "--dtype", "fp64", "--verify"]) == 0
    assert float(capsys.readouterr().out.split("max_abs_param_diff=")[1].split()[0]) <= 1e-12
    assert _schemes_to_measure(["2,1"], ["none"], config, 4) == [(2, 1, 1, "none")]
    with pytest.raises(UserError, match="tp=4 does not divide the model's kv_heads=2"):
        _schemes_to_measure(["4,1"], ["none"], config, 4)


def test_one_rank_logits_loss_and_gradients(saved):
    folder, model = saved
    ckpt = hf.Checkpoint(folder)
    mod = StageModule(ckpt.cfg, dtype=DT)
    load_full(mod, ckpt.full(DT))
    mb = TokenData(128).pack([BatchSeq(id=i, length=n) for i, n in enumerate(DOCS)])

    model.zero_grad()
    ours, theirs = runtime_logits(mod, mb), hf_forward(model, mb)
    assert (ours - theirs).abs().max() <= 1e-10 and theirs.abs().max() > 0.1
    loss = mod(None, mb)
    hf_loss = F.cross_entropy(theirs, mb.labels, ignore_index=IGNORE, reduction="sum")
    assert abs(float(loss.detach() - hf_loss.detach())) <= 1e-10
    loss.backward()
    hf_loss.backward()
    for spec, p, g in zip(param_specs(ckpt.cfg), mod.ordered_params(), hf_grads(model, ckpt.cfg)):
        assert (p.grad - g).abs().max() <= 1e-10, spec.name
        assert g.abs().max() > 0, spec.name


def test_llama31_rope_scaling_matches_transformers(tmp_path):
    """Llama 3.1's RoPE scaling (rope_type llama3) at head dim 8 and an original context of 16 tokens: wavelengths
    2*pi/inv_freq of 6.3 (between 16/4 and 16/1: interpolated), 167, 4443 and 118,000 (beyond 16: divided by 8)."""
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    model = hf_model(tmp_path, rope_parameters=rope)
    inv = [500000.0 ** (-i / 8) for i in (0, 2, 4, 6)]
    want = []
    for f in inv:
        wavelen = 2 * np.pi / f
        if wavelen < 16 / 4.0:
            want.append(f)
        elif wavelen > 16 / 1.0:
            want.append(f / 8.0)
        else:
            s = (16 / wavelen - 1.0) / (4.0 - 1.0)
            want.append((1 - s) * f / 8.0 + s * f)
    want = torch.tensor(want, dtype=DT)
    assert torch.allclose(model.model.rotary_emb.inv_freq.to(DT), want, rtol=1e-6)  # transformers' own (fp32)
    fp64_hf(model, want)
    ckpt = hf.Checkpoint(tmp_path)
    assert ckpt.cfg.rope_scaling == (8.0, 1.0, 4.0, 16)
    mod = StageModule(ckpt.cfg, dtype=DT)
    load_full(mod, ckpt.full(DT))
    mb = TokenData(128).pack([BatchSeq(id=i, length=n) for i, n in enumerate([17, 9, 3])])
    ours, theirs = runtime_logits(mod, mb), hf_forward(model, mb)
    assert (ours - theirs).abs().max() <= 1e-10
    plain = StageModule(replace(ckpt.cfg, rope_scaling=None), dtype=DT)
    load_full(plain, ckpt.full(DT))
    assert (runtime_logits(plain, mb) - theirs).abs().max() > 1e-6  # the scaling is seen


@pytest.mark.parametrize("world", [1, 3, 7])
def test_each_owner_reads_its_range_of_sharded_safetensors(tmp_path, world):
    """A checkpoint split over several safetensors files (index json) and a tied head; the owners' flat
    ranges, put together, are the canonical tensors."""
    model = hf_model(tmp_path, tied=True, shard="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ckpt = hf.Checkpoint(tmp_path)
    assert ckpt.tied
    state = model.state_dict()
    full = ckpt.full(DT)
    for s, t in zip(param_specs(ckpt.cfg), full):
        name, transposed = hf.hf_name(s.name, True)
        assert torch.equal(t, state[name].T if transposed else state[name]), s.name
    specs = param_specs(ckpt.cfg)
    lo, hi = owner_ranges(np.array([s.numel for s in specs]), world)
    shards = [ckpt.shard(lo[r], hi[r], DT) for r in range(world)]
    offsets = [np.concatenate(([0], np.cumsum(hi[r] - lo[r]))) for r in range(world)]
    for i, t in enumerate(full):
        assert torch.equal(torch.cat([shards[r][offsets[r][i]:offsets[r][i + 1]] for r in range(world)]), t.reshape(-1))


@pytest.mark.parametrize("edit,message", [
    ({"model_type": "gpt2"}, "field model_type: 'gpt2'"),
    ({"num_local_experts": 8}, "field num_local_experts: 8: mixture-of-experts"),
    ({"model_type": "mistral", "sliding_window": 4096}, "field sliding_window: 4096: sliding-window"),
    ({"num_key_value_heads": 3}, "field num_key_value_heads: 3 does not divide"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5}}, "rope_parameters.rope_type: 'yarn' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor: None is not a positive"),
    ({"hidden_act": "gelu"}, "field hidden_act: 'gelu' is not supported"),
    ({"attention_bias": True}, "field attention_bias: True"),
    ({"vocab_size": None}, "field vocab_size"),
])
def test_unsupported_configs_are_refused_in_one_line(tmp_path, edit, message):
    base = {"model_type": "llama", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in (base | edit).items() if v is not None}))
    with pytest.raises(UserError, match=message) as e:
        hf.read_config(tmp_path)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------- four ranks, TP and PP
def plans_tp_pp():
    """<2,1> next to <1,2> on permuted ranks: TP and PP cut the HF tensors differently, pipelines sum at the owners;
    then <2,1,2>, TP and CP in one pipeline: each TP rank's K/V head (kv_heads 2 over tp 2) gathered over the CP ring.
    (<2,2> in one pipeline is the same code path; kept out to keep this 4-process test short.)"""
    from hydraplan.runtime.plan_roles import build_plan

    return [make_plan(0, "mix", [(2, 1, [3, 1], [[4, 8], [2, 2, 5]]), (1, 2, [2, 0], [[9, 3], [6], [1, 4]])]),
            build_plan(1, "tp-cp", 4, [(2, 1, 2, [1, 3, 0, 2], [[9, 5], [7, 3, 4]])], first_id=20)]


@pytest.mark.slow
def test_four_ranks_with_tp_pp_and_cp_match_transformers(saved, tmp_path):
    """The replay path (Replayer.step: pull, 1F1B with TP/PP, push) on 4 gloo ranks from the HF weights;
    the workers (tests/hf_replay_worker.py, which never imports transformers) save the loss and the owners'
    summed gradients, compared here with transformers' on the same micro-batches."""
    from hf_replay_worker import replay_gradients

    folder, model = saved
    spawn(replay_gradients, (4, free_port(), str(folder), plans_tp_pp(), str(tmp_path / "out.pt")), 4)
    results = torch.load(tmp_path / "out.pt", weights_only=True)
    data = TokenData(128)
    cfg = hf.read_config(folder)[0]
    for plan, (loss, ours) in zip(plans_tp_pp(), results, strict=True):
        model.zero_grad()
        scale = 1.0 / data.labeled_tokens(plan)
        hf_loss = 0.0
        for pipeline in plan.pipelines:
            for seqs in micro_batch_seqs(plan, pipeline):
                mb = data.pack(seqs)
                mb_loss = F.cross_entropy(hf_forward(model, mb), mb.labels, ignore_index=IGNORE, reduction="sum") * scale
                mb_loss.backward()
                hf_loss += float(mb_loss.detach())
        assert abs(loss - hf_loss) <= 1e-10, (plan.strategy, loss, hf_loss)
        for spec, g, h in zip(param_specs(cfg), ours, hf_grads(model, cfg), strict=True):
            assert (g - h.reshape(-1)).abs().max() <= 1e-10, (plan.strategy, spec.name)
            assert h.abs().max() > 0, spec.name


def test_run_plan_init_from_trains_the_hf_weights(saved, tmp_path, monkeypatch, capsys):
    """run_plan --init-from: the first iteration's loss is transformers' loss on the same batch, and
    --verify's single-process reference starts from the same weights."""
    from hydraplan.runtime.run_plan import main
    from hydraplan.store.fileio import write_model

    folder, model = saved
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    plan = make_plan(0, "S", [(1, 1, [0], [[5, 9], [4]])], gpus=1)
    write_model(tmp_path / "plan.json", plan)
    assert main([str(tmp_path / "plan.json"), "--init-from", str(folder), "--dtype", "fp64", "--verify"]) == 0
    out = capsys.readouterr().out
    data = TokenData(128)
    with torch.no_grad():
        want = sum(F.cross_entropy(hf_forward(model, data.pack(seqs)), data.pack(seqs).labels, ignore_index=IGNORE,
                                   reduction="sum") for seqs in micro_batch_seqs(plan, plan.pipelines[0]))
    want = float(want) / data.labeled_tokens(plan)
    assert f"loss={want:.6f} " in out
    assert float(out.split("max_abs_param_diff=")[1].split()[0]) <= 1e-12
    assert main([str(tmp_path / "plan.json"), "--init-from", str(folder), "--model", "tiny"]) == 2
    assert "--model and --init-from: give one" in capsys.readouterr().err
