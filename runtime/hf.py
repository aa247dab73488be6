"""Hugging Face Llama, Mistral and Qwen2 checkpoints (config.json + safetensors) in the runtime's canonical layout.

Names and layouts (runtime/model.py stores the row-parallel weights input-major, so two are transposed):
    model.embed_tokens.weight                       embed.weight
    model.layers.i.input_layernorm.weight           layers.i.attn_norm.weight
    model.layers.i.self_attn.{q,k,v}_proj.weight    layers.i.attn.{wq,wk,wv}
    model.layers.i.self_attn.{q,k,v}_proj.bias      layers.i.attn.{bq,bk,bv}   (Qwen2)
    model.layers.i.self_attn.o_proj.weight          layers.i.attn.wo      = o_proj.T
    model.layers.i.post_attention_layernorm.weight  layers.i.mlp_norm.weight
    model.layers.i.mlp.{gate,up}_proj.weight        layers.i.mlp.{w_gate,w_up}
    model.layers.i.mlp.down_proj.weight             layers.i.mlp.w_down   = down_proj.T
    model.norm.weight                               norm.weight
    lm_head.weight (embed_tokens with tied ones)    head.weight
Both use rotate-half RoPE on q_proj/k_proj outputs, so q and k need no permutation.

An optimizer owner reads only its flat range of each parameter (`read_range`: the rows, or for the
transposed ones the columns, that cover it, through safetensors' lazy slices), so no rank materialises the
whole model; TP/PP slicing then happens in LNK pull like for any other initialization.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hydraplan.core.errors import UserError
from hydraplan.core.hfconfig import parse_hf_config
from hydraplan.runtime.model import ModelConfig, ParamSpec, get_config, param_specs
from hydraplan.store.fileio import read_json

_LAYER = {
    "attn_norm.weight": ("input_layernorm.weight", False),
    "attn.wq": ("self_attn.q_proj.weight", False),
    "attn.wk": ("self_attn.k_proj.weight", False),
    "attn.wv": ("self_attn.v_proj.weight", False),
    "attn.bq": ("self_attn.q_proj.bias", False),
    "attn.bk": ("self_attn.k_proj.bias", False),
    "attn.bv": ("self_attn.v_proj.bias", False),
    "attn.wo": ("self_attn.o_proj.weight", True),
    "mlp_norm.weight": ("post_attention_layernorm.weight", False),
    "mlp.w_gate": ("mlp.gate_proj.weight", False),
    "mlp.w_up": ("mlp.up_proj.weight", False),
    "mlp.w_down": ("mlp.down_proj.weight", True),
}


def hf_name(name: str, tied: bool) -> tuple[str, bool]:
    """The Hugging Face tensor holding canonical parameter `name`, and whether it is stored transposed."""
    if name == "embed.weight" or (name == "head.weight" and tied):
        return "model.embed_tokens.weight", False
    if name == "head.weight":
        return "lm_head.weight", False
    if name == "norm.weight":
        return "model.norm.weight", False
    _, i, rest = name.split(".", 2)
    hf, transposed = _LAYER[rest]
    return f"model.layers.{i}.{hf}", transposed


def read_config(folder: str | Path) -> tuple[ModelConfig, bool]:
    """The model of a Hugging Face folder's config.json, and whether its embeddings are tied."""
    path = Path(folder) / "config.json"
    return config_from_file(path, f"--init-from: {path}", f"hf:{Path(folder).name}")


def model_config(model: str) -> ModelConfig:
    """A runtime model config by name (runtime/model.py CONFIGS), or the model of a config.json given by its path."""
    if model.endswith(".json"):
        return config_from_file(model, f"--hf-config {model}", f"hf:{Path(model).stem}")[0]
    return get_config(model)


def config_from_file(path: str | Path, src: str, name: str) -> tuple[ModelConfig, bool]:
    """The runtime's model of a config.json (Llama, Mistral or Qwen2: hydraplan.core.hfconfig, the config the
    analytic profiles read), and whether its embeddings are tied. UserError (one line, `src` and the field) for
    what the decoder does not implement: the analytic model's refusals and RoPE scaling other than Llama 3.1's."""
    try:
        data = read_json(path)
    except UserError as e:
        raise UserError(f"{src}: {str(e).removeprefix(f'{path}: ')}") from None
    c = parse_hf_config(data, src)
    if c.rope_type not in ("default", "llama3"):
        raise UserError(f"{src}: field {c.rope_field}.rope_type: {c.rope_type!r} is not supported (the runtime "
                        "implements 'default' and 'llama3')")
    cfg = ModelConfig(name=name, vocab=c.vocab_size, hidden=c.hidden_size, layers=c.num_hidden_layers,
                      heads=c.num_attention_heads, kv_heads=c.kv_heads, ffn=c.intermediate_size, rope_theta=c.theta,
                      norm_eps=c.rms_norm_eps, qkv_bias=c.qkv_bias,
                      rope_scaling=c.llama3_scaling(src) if c.rope_type == "llama3" else None)
    return cfg, c.tie_word_embeddings


class Checkpoint:
    """The safetensors files of a folder (model.safetensors, or shards named by model.safetensors.index.json)."""

    def __init__(self, folder: str | Path):
        from safetensors import safe_open

        self.folder = Path(folder)
        self.cfg, self.tied = read_config(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (self.folder / "model.safetensors").exists():
            files = ["model.safetensors"]
        else:
            raise UserError(f"--init-from: {folder}: no model.safetensors or model.safetensors.index.json")
        self._where, self._files = {}, [safe_open(self.folder / f, framework="pt") for f in files]
        for f in self._files:
            for k in f.keys():
                self._where[k] = f
        for spec in param_specs(self.cfg):
            name, transposed = hf_name(spec.name, self.tied)
            if name not in self._where:
                raise UserError(f"--init-from: {folder}: tensor {name} is missing")
            shape = tuple(self._where[name].get_slice(name).get_shape())
            want = spec.shape[::-1] if transposed else spec.shape
            if shape != want:
                raise UserError(f"--init-from: {folder}: tensor {name} has shape {list(shape)}, config.json implies {list(want)}")

    def read_range(self, spec: ParamSpec, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        """Elements [lo, hi) of the flattened canonical tensor, reading only the rows (columns of a
        transposed tensor) that hold them."""
        name, transposed = hf_name(spec.name, self.tied)
        sl = self._where[name].get_slice(name)
        if lo >= hi:
            return torch.zeros(0, dtype=dtype)
        if len(spec.shape) == 1:
            return sl[lo:hi].to(dtype)
        cols = spec.shape[1]
        r0, r1 = lo // cols, -(-hi // cols)
        rows = sl[:, r0:r1].T if transposed else sl[r0:r1]
        return rows.reshape(-1)[lo - r0 * cols: hi - r0 * cols].to(dtype)

    def shard(self, lo: np.ndarray, hi: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """An optimizer owner's flat shard: range [lo[i], hi[i]) of every parameter, in canonical order."""
        specs = param_specs(self.cfg)
        return torch.cat([self.read_range(s, int(lo[i]), int(hi[i]), dtype) for i, s in enumerate(specs)])

    def full(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """Every canonical tensor whole (the single-process reference)."""
        return [self.read_range(s, 0, s.numel, dtype).reshape(s.shape) for s in param_specs(self.cfg)]
