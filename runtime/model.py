"""LLaMA-style decoder with Megatron tensor parallelism and pipeline stage slicing.

Canonical parameters. Every parameter has one full-tensor definition (`param_specs`), the same for every
strategy, so the optimizer can own fixed shards of it while pipelines of any <TP,PP> cut it differently.
The tensor-parallel dimension is always dim 0 of the canonical tensor, so TP rank t of degree tp holds
the contiguous slice [t*numel/tp, (t+1)*numel/tp) of the flattened tensor, and resharding between layouts
is interval arithmetic on flat ranges (runtime/lnk.py). That is why the row-parallel weights (attention
output `wo`, MLP `w_down`) are stored input-major, [in, out], and applied as x @ W:
    column-parallel  wq, wk, wv [heads*head_dim, hidden]; w_gate, w_up [ffn, hidden]     y = x @ W.T
    row-parallel     wo [heads*head_dim, hidden]; w_down [ffn, hidden]                      y = x @ W
    vocab-parallel   embed.weight, head.weight [vocab, hidden]
    replicated       RMSNorm weights [hidden] (identical on every TP rank; each TP rank's gradient is its tokens' part)
Pipeline stage s of pp holds layers [s*L//pp, (s+1)*L//pp); the embedding sits on the first stage, the
final norm and the LM head on the last. Context parallelism needs no parameter layout: a CP rank runs
the stage on its share of the tokens, and attention reaches the other CP ranks' keys and values through
the micro-batch's CP context (runtime/context_parallel.py).
With tp > 1 the TP ranks always run with sequence parallelism (runtime/sequence_parallel.py): between the
TP regions each holds `TPGroup.rows(n)` of the n tokens, which is also what a stage sends the next one.
Activation recomputation is the stage's `recompute` mode (runtime/recompute.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hydraplan.core.errors import UserError
from hydraplan.core.hardware import MODELS
from hydraplan.runtime import kernels
from hydraplan.runtime.attention import Windows, keeps_scores, window_attention
from hydraplan.runtime.batches import IGNORE, PackedBatch
from hydraplan.runtime.context_parallel import attend_gathered, gather_kv
from hydraplan.runtime.recompute import MODES, recomputed, swiglu_down
from hydraplan.runtime.sequence_parallel import TPGroup, gather_linear, scatter_to_sp

INIT_STD = 0.02


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qkv_bias: bool = False  # biases on the Q, K, V projections (Qwen2)
    rope_scaling: tuple[float, float, float, int] | None = None  # Llama 3.1's: factor, low/high freq factor, old context

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


TINY = ModelConfig("tiny", vocab=128, hidden=32, layers=4, heads=4, kv_heads=4, ffn=64)
"""CPU tests: every TP degree up to 4 divides heads, ffn and vocab, and PP up to 4 has a layer per stage."""

TINY_WIDE = ModelConfig("tiny-wide", vocab=128, hidden=256, layers=8, heads=4, kv_heads=4, ffn=512)
"""CPU tests of LNK overlap: layers wide enough that pulling and pushing one takes measurable time on gloo,
many of them so that the first pull and the last push are a small part of the traffic."""

CONFIGS: dict[str, ModelConfig] = {TINY.name: TINY, TINY_WIDE.name: TINY_WIDE} | {
    m.key: ModelConfig(m.key, vocab=m.vocab, hidden=m.hidden, layers=m.layers, heads=m.heads, kv_heads=m.heads, ffn=m.ffn)
    for m in MODELS.values()  # the shapes the analytic profiles use (llama2-7b, -13b, -32b)
}


def get_config(name: str) -> ModelConfig:
    if name not in CONFIGS:
        raise UserError(f"--model: unknown model {name!r} (known: {', '.join(CONFIGS)})")
    return CONFIGS[name]


def check_layout(cfg: ModelConfig, tp: int, pp: int) -> str | None:
    """Why <tp, pp> cannot run this model, or None."""
    for what, size in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn), ("vocab", cfg.vocab)):
        if size % tp:
            return f"tp={tp} does not divide the model's {what}={size}"
    if pp > cfg.layers:
        return f"pp={pp} exceeds the model's {cfg.layers} layers"
    return None


# ------------------------------------------------------------------------------------ canonical params
@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    sharded: bool  # split along dim 0 across TP ranks; else replicated
    layer: int  # -1: embedding, 0..L-1: decoder layer, L: final norm and head
    init: Literal["normal", "ones", "zeros"]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@functools.cache
def param_specs(cfg: ModelConfig) -> tuple[ParamSpec, ...]:
    """All parameters in canonical order (the order of the optimizer's flat shards)."""
    H, D = cfg.hidden, cfg.head_dim
    specs = [ParamSpec("embed.weight", (cfg.vocab, H), True, -1, "normal")]
    for i in range(cfg.layers):
        p = f"layers.{i}."
        specs += [
            ParamSpec(p + "attn_norm.weight", (H,), False, i, "ones"),
            ParamSpec(p + "attn.wq", (cfg.heads * D, H), True, i, "normal"),
            ParamSpec(p + "attn.wk", (cfg.kv_heads * D, H), True, i, "normal"),
            ParamSpec(p + "attn.wv", (cfg.kv_heads * D, H), True, i, "normal"),
        ]
        if cfg.qkv_bias:  # column-parallel like their weights: TP rank t adds its heads' slice
            specs += [ParamSpec(p + f"attn.b{x}", (n * D,), True, i, "zeros")
                      for x, n in (("q", cfg.heads), ("k", cfg.kv_heads), ("v", cfg.kv_heads))]
        specs += [
            ParamSpec(p + "attn.wo", (cfg.heads * D, H), True, i, "normal"),
            ParamSpec(p + "mlp_norm.weight", (H,), False, i, "ones"),
            ParamSpec(p + "mlp.w_gate", (cfg.ffn, H), True, i, "normal"),
            ParamSpec(p + "mlp.w_up", (cfg.ffn, H), True, i, "normal"),
            ParamSpec(p + "mlp.w_down", (cfg.ffn, H), True, i, "normal"),
        ]
    specs += [
        ParamSpec("norm.weight", (H,), False, cfg.layers, "ones"),
        ParamSpec("head.weight", (cfg.vocab, H), True, cfg.layers, "normal"),
    ]
    return tuple(specs)


def stage_layers(layers: int, pp: int, stage: int) -> range:
    return range(stage * layers // pp, (stage + 1) * layers // pp)


def stage_param_indices(cfg: ModelConfig, pp: int, stage: int) -> list[int]:
    """Indices into `param_specs(cfg)` of the parameters pipeline stage `stage` of `pp` holds."""
    own = set(stage_layers(cfg.layers, pp, stage))
    if stage == 0:
        own.add(-1)
    if stage == pp - 1:
        own.add(cfg.layers)
    return [i for i, s in enumerate(param_specs(cfg)) if s.layer in own]


INIT_CHUNK = 1 << 20
"""Initial values are drawn in chunks of this many flat elements, each from its own seeded generator, so
any range of a parameter can be generated alone (`init_range`) with values independent of who asks."""


def init_range(spec: ParamSpec, index: int, seed: int, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    """Elements [lo, hi) of parameter `index`'s flattened canonical initial value. An optimizer owner
    generates only its shard (plus at most two partial chunks), not the whole model; every owner, the
    single-process reference and any world size see the same values."""
    if spec.init in ("ones", "zeros"):
        return (torch.ones if spec.init == "ones" else torch.zeros)(hi - lo, dtype=dtype)
    parts = []
    for c in range(lo // INIT_CHUNK, -(-hi // INIT_CHUNK)):
        start, end = c * INIT_CHUNK, min((c + 1) * INIT_CHUNK, spec.numel)
        gen = torch.Generator().manual_seed((seed * 1_000_003 + index) * 1_000_033 + c)
        chunk = torch.randn(end - start, generator=gen, dtype=torch.float64)
        parts.append(chunk[max(lo, start) - start: min(hi, end) - start])
    return (torch.cat(parts) * INIT_STD).to(dtype) if parts else torch.zeros(0, dtype=dtype)


def init_full(spec: ParamSpec, index: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """The canonical initial value of parameter `index` (tests and the reference; see `init_range`)."""
    return init_range(spec, index, seed, 0, spec.numel, dtype).reshape(spec.shape)


# --------------------------------------------------------------------------------- tensor parallelism
class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: forward sums the TP ranks' partial outputs; the (replicated) gradient passes through."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp.group)


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab_start: int, tp: TPGroup) -> torch.Tensor:
    """Per-token cross-entropy when each TP rank holds the logits of vocab [vocab_start, +local)."""
    local = logits.shape[-1]
    m = kernels.upcast(logits.detach().max(dim=-1).values)  # the loss runs in fp32, as Megatron's
    if tp.size > 1:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=tp.group)
    idx = labels - vocab_start
    inside = (idx >= 0) & (idx < local)
    sum_exp, target = kernels.active().loss_parts(logits, m, idx.clamp(0, local - 1), inside)
    return reduce_from_tp(sum_exp, tp).log() - reduce_from_tp(target, tp)


# ------------------------------------------------------------------------------------------- modules
def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                scaling: tuple[float, float, float, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim)
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, *scaling)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype)[:, None, :], angles.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return kernels.active().rope(x, cos, sin)


def llama3_inv_freq(inv_freq: torch.Tensor, factor: float, low: float, high: float, old_context: int) -> torch.Tensor:
    """Llama 3.1's RoPE scaling: wavelengths beyond old_context/low divided by `factor`, below old_context/high kept,
    those between interpolated smoothly (in old_context / wavelength) from one to the other."""
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class _RMSNorm(torch.autograd.Function):
    """x * rstd(x) * w keeping only x (the caller's tensor, in the compute dtype) and rstd (fp32 for bf16/fp16,
    one per token) for the backward: autograd through the formula would also keep an fp32 copy of x and the
    normalized tensor, 4x the memory model's 2h bytes per token and norm (hydraplan.core.hardware activations)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, eps: float):
        y, rstd = kernels.active().rms_norm(x, w, eps)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        return *kernels.active().rms_norm_backward(dy, *ctx.saved_tensors), None


class RMSNorm(nn.Module):
    """On SP rows under TP: its replicated weight's gradient is this TP rank's tokens' part; LNK push sums the
    TP ranks' parts at the owners, once per iteration (runtime/lnk.py)."""

    def __init__(self, dim: int, eps: float, tp: TPGroup, **kw):
        super().__init__()
        self.eps, self.tp = eps, tp
        self.weight = nn.Parameter(torch.empty(dim, **kw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, recompute: str, **kw):
        super().__init__()
        self.tp, self.head_dim, self.recompute = tp, cfg.head_dim, recompute
        self.wq = nn.Parameter(torch.empty(cfg.heads * cfg.head_dim // tp.size, cfg.hidden, **kw))
        self.wk = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim // tp.size, cfg.hidden, **kw))
        self.wv = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim // tp.size, cfg.hidden, **kw))
        self.wo = nn.Parameter(torch.empty(cfg.heads * cfg.head_dim // tp.size, cfg.hidden, **kw))
        self.bias = cfg.qkv_bias
        if cfg.qkv_bias:
            self.bq = nn.Parameter(torch.empty(cfg.heads * cfg.head_dim // tp.size, **kw))
            self.bk = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim // tp.size, **kw))
            self.bv = nn.Parameter(torch.empty(cfg.kv_heads * cfg.head_dim // tp.size, **kw))

    def forward(self, x, cos, sin, mb: PackedBatch):
        q, k, v = self.qkv(x, cos, sin, mb.num_tokens)
        if mb.cp is None:
            o = self.core(window_attention, q, k, v, mb.windows, windows=mb.windows)
        else:
            o = self.core(attend_gathered, q, gather_kv(k, v, mb.cp), mb.cp, windows=mb.cp.windows)
        return self.out(o)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
        """Post-RoPE queries, keys [n, heads/tp or kv_heads/tp, head_dim] and values of the n tokens whose SP rows
        are x (grouped-query attention: each K/V head serves heads/kv_heads query heads, attention.py)."""
        q, k, v = gather_linear(x, n, self.tp, self.wq, self.wk, self.wv)
        if self.bias:
            q, k, v = q + self.bq, k + self.bk, v + self.bv
        q, k, v = (y.unflatten(-1, (-1, self.head_dim)) for y in (q, k, v))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def core(self, fn, q: torch.Tensor, *args, windows: Windows) -> torch.Tensor:
        """The attention core fn(q, *args) (no collective inside); under selective recomputation it is
        recomputed in the backward where its kernel would keep score matrices (attention.keeps_scores)."""
        if self.recompute == "selective" and keeps_scores(q, windows):
            return recomputed(fn, q, *args)
        return fn(q, *args)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """The output projection of the attention output o [n, heads/tp, head_dim], back on SP rows."""
        return scatter_to_sp(o.flatten(-2) @ self.wo, self.tp)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, recompute: str, **kw):
        super().__init__()
        self.tp, self.recompute = tp, recompute
        self.w_gate = nn.Parameter(torch.empty(cfg.ffn // tp.size, cfg.hidden, **kw))
        self.w_up = nn.Parameter(torch.empty(cfg.ffn // tp.size, cfg.hidden, **kw))
        self.w_down = nn.Parameter(torch.empty(cfg.ffn // tp.size, cfg.hidden, **kw))

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """SwiGLU of the n tokens whose SP rows are x."""
        g, u = gather_linear(x, n, self.tp, self.w_gate, self.w_up)
        return scatter_to_sp(swiglu_down(g, u, self.w_down, self.recompute), self.tp)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, recompute: str, **kw):
        super().__init__()
        self.recompute = recompute
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, tp, **kw)
        self.attn = Attention(cfg, tp, recompute, **kw)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, tp, **kw)
        self.mlp = MLP(cfg, tp, recompute, **kw)

    def forward(self, x, cos, sin, mb: PackedBatch):
        if self.recompute == "full":
            return recomputed(self._forward, x, cos, sin, mb)
        return self._forward(x, cos, sin, mb)

    def _forward(self, x, cos, sin, mb: PackedBatch):
        x = x + self.attn(self.attn_norm(x), cos, sin, mb)
        return x + self.mlp(self.mlp_norm(x), mb.num_tokens)


class _Embedding(torch.autograd.Function):
    """F.embedding whose weight gradient sums each row's token gradients in fp32 for bf16/fp16 weights, as CUDA's
    embedding backward does (an fp32 accumulator) and Megatron's fp32 main grads assume. torch's CPU backward
    index-adds in the weight's dtype: in bf16 a row's error grows with the number of its tokens (1.5e-2 relative at
    19K tokens of a 128-token vocabulary against 3.8e-3 at 1K), the largest length-dependent error of a bf16 replay."""

    @staticmethod
    def forward(ctx, idx: torch.Tensor, weight: torch.Tensor):
        ctx.save_for_backward(idx)
        ctx.rows, ctx.dtype = weight.shape[0], weight.dtype
        return F.embedding(idx, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (idx,) = ctx.saved_tensors
        acc = torch.float32 if ctx.dtype in (torch.float16, torch.bfloat16) else ctx.dtype
        dw = grad.new_zeros(ctx.rows, grad.shape[-1], dtype=acc).index_add_(0, idx, grad.to(acc))
        return None, dw.to(ctx.dtype)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, **kw):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(cfg.vocab // tp.size, cfg.hidden, **kw))
        self.start = tp.rank * (cfg.vocab // tp.size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        idx = tokens - self.start
        inside = (idx >= 0) & (idx < self.weight.shape[0])
        out = _Embedding.apply(idx.clamp(0, self.weight.shape[0] - 1), self.weight).masked_fill(~inside[:, None], 0.0)
        return scatter_to_sp(out, self.tp)


class VocabParallelHead(nn.Module):
    """LM head + cross-entropy; returns the SUM of the micro-batch's token losses (IGNORE labels skipped)."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, **kw):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(cfg.vocab // tp.size, cfg.hidden, **kw))
        self.start = tp.rank * (cfg.vocab // tp.size)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """x: the SP rows of the tokens whose labels are given."""
        (logits,) = gather_linear(x, labels.shape[0], self.tp, self.weight)
        losses = vocab_parallel_cross_entropy(logits, labels, self.start, self.tp)
        return losses.masked_fill(labels == IGNORE, 0.0).sum()


class StageModule(nn.Module):
    """The part of the model one rank runs: stage `stage` of `pp`, TP shard `tp.rank` of `tp.size`, with
    activation recomputation `recompute` (runtime/recompute.py).

    Parameters are allocated empty: the runtime pulls their values (lnk.py), tests use `load_full`.
    forward(x, mb): x is ignored on the first stage (it embeds mb.tokens); the last stage returns the
    summed token loss, the others the hidden states [tp.rows(T), hidden] (this TP rank's SP rows) for the
    next stage.
    """

    def __init__(self, cfg: ModelConfig, *, pp: int = 1, stage: int = 0, tp: TPGroup = TPGroup(),
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", recompute: str = "none"):
        super().__init__()
        if recompute not in MODES:
            raise ValueError(f"recompute must be one of {MODES}, not {recompute!r}")
        kw = {"dtype": dtype, "device": device}
        self.cfg, self.dtype, self.tp = cfg, dtype, tp
        self.first, self.last = stage == 0, stage == pp - 1
        self.param_indices = stage_param_indices(cfg, pp, stage)
        if self.first:
            self.embed = VocabParallelEmbedding(cfg, tp, **kw)
        self.layers = nn.ModuleDict({str(i): Block(cfg, tp, recompute, **kw) for i in stage_layers(cfg.layers, pp, stage)})
        if self.last:
            self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, tp, **kw)
            self.head = VocabParallelHead(cfg, tp, **kw)

    def ordered_params(self) -> list[nn.Parameter]:
        """Local parameters in canonical order (matching `param_indices`)."""
        named = dict(self.named_parameters())
        specs = param_specs(self.cfg)
        return [named[specs[i].name] for i in self.param_indices]

    def forward(self, x: torch.Tensor | None, mb: PackedBatch) -> torch.Tensor:
        if self.first:
            x = self.embed(mb.tokens)
        cos, sin = rope_tables(mb.positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype, self.cfg.rope_scaling)
        for block in self.layers.values():
            x = block(x, cos, sin, mb)
        return self.head(self.norm(x), mb.labels) if self.last else x


def param_groups(cfg: ModelConfig) -> list[int]:
    """LNK layer group of every canonical parameter: 0 the embedding, i+1 decoder layer i, L+1 norm and head
    (non-decreasing in canonical order, the order a forward uses them)."""
    return [s.layer + 1 for s in param_specs(cfg)]


def group_entries(module: StageModule) -> list[tuple[int, nn.Module]]:
    """(layer group, the first sub-module that uses it) of a stage: a forward pre-hook there runs right before
    the group's parameters are first needed, in StageModule.forward and in Seq1F1B's split forward alike."""
    out: list[tuple[int, nn.Module]] = [(0, module.embed)] if module.first else []
    out += [(int(i) + 1, block.attn_norm) for i, block in module.layers.items()]
    if module.last:
        out.append((module.cfg.layers + 1, module.norm))
    return out


def bind_params(module: StageModule, indices: list[int], flat: torch.Tensor) -> list[nn.Parameter]:
    """Make the stage's parameters `indices` (canonical, in order) views of one flat buffer (e.g. a pulled
    layer group), so the module's storage is that buffer: build the module on the meta device first, so
    nothing else is allocated. Returns the new parameters."""
    specs = param_specs(module.cfg)
    out, at = [], 0
    for i in indices:
        owner, _, attr = specs[i].name.rpartition(".")
        sub = module.get_submodule(owner)
        shape = getattr(sub, attr).shape
        n = math.prod(shape)
        p = nn.Parameter(flat[at:at + n].view(shape))
        setattr(sub, attr, p)
        out.append(p)
        at += n
    if at != flat.numel():
        raise ValueError(f"buffer holds {flat.numel()} elements, parameters {indices} {at}")
    return out


def tp_slice(full: torch.Tensor, spec: ParamSpec, tp: int, tp_rank: int) -> torch.Tensor:
    """TP rank `tp_rank`'s part of a canonical tensor: a contiguous dim-0 chunk (or all of it if replicated)."""
    return full.chunk(tp, dim=0)[tp_rank] if spec.sharded else full


@torch.no_grad()
def load_full(module: StageModule, full: list[torch.Tensor], tp: int = 1, tp_rank: int = 0) -> None:
    """Fill a stage from canonical full tensors (indexed like `param_specs`)."""
    specs = param_specs(module.cfg)
    for i, p in zip(module.param_indices, module.ordered_params()):
        p.copy_(tp_slice(full[i], specs[i], tp, tp_rank))
