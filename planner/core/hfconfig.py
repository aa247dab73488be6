"""A Hugging Face `config.json` of a dense LLaMA-style decoder (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM): the fields hydraplan reads, what it refuses, and the ModelSpec the analytic profiles use.
The runtime (runtime/hf.py) reads the same model, so both sides refuse the same configs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from hydraplan.core.errors import UserError
from hydraplan.core.hardware import ModelSpec

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# fields whose presence means an architecture the cost model and the runtime do not have
_REFUSED = {
    "num_local_experts": "mixture-of-experts (Mixtral)",
    "num_experts": "mixture-of-experts (Qwen-MoE)",
    "n_routed_experts": "mixture-of-experts (DeepSeek)",
    "kv_lora_rank": "multi-head latent attention (DeepSeek MLA)",
    "q_lora_rank": "multi-head latent attention (DeepSeek MLA)",
}


class HFConfig(BaseModel):
    """The fields of a transformers config.json that decide the model (others are kept and ignored)."""

    model_config = ConfigDict(extra="allow")

    model_type: str
    architectures: list[str] | None = None
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = Field(None, description="absent: multi-head attention")
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    head_dim: PositiveInt | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Llama/Mistral: biases on q, k, v and o_proj; Qwen2 has q, k, v biases always
    mlp_bias: bool = False
    hidden_act: str = "silu"
    rms_norm_eps: float = Field(1e-6, gt=0)
    rope_theta: float | None = Field(None, gt=0)
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None  # transformers >= 5: rope_theta and rope_type in one block
    sliding_window: int | None = None
    use_sliding_window: bool | None = None  # Qwen2: sliding_window only applies when this is true

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2"

    @property
    def theta(self) -> float:
        return float((self.rope_parameters or {}).get("rope_theta") or self.rope_theta or 10000.0)

    @property
    def rope_field(self) -> str:
        return "rope_parameters" if self.rope_parameters else "rope_scaling"

    @property
    def rope_type(self) -> str:
        """'default', or the scaling the config asks for ('llama3', 'yarn', ...)."""
        block = self.rope_parameters or self.rope_scaling or {}
        return str(block.get("rope_type") or block.get("type") or "default")

    def llama3_scaling(self, src: str) -> tuple[float, float, float, int]:
        """(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) of Llama 3.1's RoPE scaling."""
        block = self.rope_parameters or self.rope_scaling or {}
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        for k in keys:
            if not isinstance(block.get(k), (int, float)) or block[k] <= 0:
                raise UserError(f"{src}: field {self.rope_field}.{k}: {block.get(k)!r} is not a positive number")
        if block["high_freq_factor"] <= block["low_freq_factor"]:
            raise UserError(f"{src}: field {self.rope_field}.high_freq_factor: {block['high_freq_factor']!r} is not above "
                            f"low_freq_factor {block['low_freq_factor']!r}")
        return (float(block["factor"]), float(block["low_freq_factor"]), float(block["high_freq_factor"]),
                int(block["original_max_position_embeddings"]))


def parse_hf_config(data: Any, src: str) -> HFConfig:
    """The config of a JSON object, or UserError (one line, naming `src` and the field) for a malformed config or
    an architecture hydraplan cannot model: mixture-of-experts, latent attention, sliding-window attention, biased
    output or MLP projections, a head size other than hidden/heads, an activation other than SiLU."""
    if not isinstance(data, dict):
        raise UserError(f"{src}: not a JSON object")
    for field, what in _REFUSED.items():
        if data.get(field):
            raise UserError(f"{src}: field {field}: {data[field]!r}: {what} is not modelled (dense LLaMA-style "
                            "decoders only)")
    try:
        cfg = HFConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        got = "missing" if first["type"] == "missing" else f"{first['msg']} (got {first['input']!r})"
        raise UserError(f"{src}: field {loc}: {got}") from None
    if cfg.model_type not in MODEL_TYPES:
        raise UserError(f"{src}: field model_type: {cfg.model_type!r} is not one of {', '.join(map(repr, MODEL_TYPES))}")
    for arch in cfg.architectures or []:
        if arch not in MODEL_TYPES.values():
            raise UserError(f"{src}: field architectures: {arch!r} is not one of {', '.join(MODEL_TYPES.values())}")
    window = cfg.sliding_window if (cfg.model_type != "qwen2" or cfg.use_sliding_window) else None
    if window is not None:
        field = "use_sliding_window" if cfg.model_type == "qwen2" else "sliding_window"
        raise UserError(f"{src}: field {field}: {getattr(cfg, field)!r}: sliding-window attention is not modelled "
                        "(full causal attention only; null or false for full attention)")
    for field, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if getattr(cfg, field) != want:
            raise UserError(f"{src}: field {field}: {getattr(cfg, field)!r} is not supported (LLaMA-style decoders "
                            f"have {want!r})")
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads
    if h % heads:
        raise UserError(f"{src}: field num_attention_heads: {heads} does not divide hidden_size {h}")
    if cfg.head_dim not in (None, h // heads):
        raise UserError(f"{src}: field head_dim: {cfg.head_dim} differs from hidden_size/num_attention_heads = "
                        f"{h // heads} (not modelled)")
    if heads % kv:
        raise UserError(f"{src}: field num_key_value_heads: {kv} does not divide num_attention_heads {heads}")
    return cfg


def model_spec(cfg: HFConfig, key: str, name: str, source: str) -> ModelSpec:
    """The analytic cost model's view of a config (rope scaling changes no cost term, only the runtime's RoPE)."""
    return ModelSpec(key, name, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, ffn=cfg.intermediate_size,
                     heads=cfg.num_attention_heads, vocab=cfg.vocab_size, source=source, kv_heads=cfg.kv_heads,
                     tied=cfg.tie_word_embeddings, qkv_bias=cfg.qkv_bias, rope_theta=cfg.theta)
