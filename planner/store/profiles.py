"""Profiles on disk: the bundled ones by name, profile JSON files, and the regenerated analytic set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydraplan.core.analytic import analytic_profile, analytic_profiles
from hydraplan.core.errors import UserError
from hydraplan.core.frameworks import FRAMEWORK, FRAMEWORKS, FrameworkSpec
from hydraplan.core.hardware import GPUS, MODELS, GPUSpec, ModelSpec
from hydraplan.core.hfconfig import HFConfig, model_spec, parse_hf_config
from hydraplan.core.schema import Profile
from hydraplan.core.stagetime import DTYPES
from hydraplan.store.fileio import load_model, read_json, write_model
from hydraplan.store.paths import DATA_DIR, PROFILES_DIR

HF_CONFIGS_DIR = DATA_DIR / "models"
"""The bundled Hugging Face configs (data/models/*.json, sources in its README.md)."""
HF_BUNDLED_GPUS = ("h100", "h200")
"""The GPUs the bundled HF-config profiles are generated for (profile GPU-STEM of data/models/STEM.json)."""


def bundled_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """A bundled profile by name (e.g. h100-llama2-7b) or a path to a profile JSON."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return load_model(Profile, path)
    bundled = PROFILES_DIR / f"{name_or_path}.json"
    if bundled.exists():
        return load_model(Profile, bundled)
    names = ", ".join(p.stem for p in bundled_profiles())
    raise UserError(f"unknown profile {name_or_path!r}: not a file, and not a bundled profile ({names})")


def read_hf_config(path: str | Path) -> HFConfig:
    """A Hugging Face config.json, checked (hydraplan.core.hfconfig.parse_hf_config: one-line errors)."""
    return parse_hf_config(read_json(path), str(path))


def hf_model(config: str | Path) -> ModelSpec:
    """The analytic cost model's view of a Hugging Face config file (key: the file's stem)."""
    path = Path(config)
    cfg = read_hf_config(path)
    kv = cfg.kv_heads
    source = (f"{path.name} ({', '.join(cfg.architectures or [cfg.model_type])}): {cfg.num_hidden_layers} layers, hidden "
              f"{cfg.hidden_size}, FFN {cfg.intermediate_size}, {cfg.num_attention_heads} heads, {kv} K/V heads, vocab "
              f"{cfg.vocab_size:,}, {'tied' if cfg.tie_word_embeddings else 'untied'} embeddings, "
              f"{'QKV bias' if cfg.qkv_bias else 'no bias'}, RoPE base {cfg.theta:,.0f}"
              + (f" ({cfg.rope_type} scaling: no cost term)" if cfg.rope_type != "default" else ""))
    return model_spec(cfg, path.stem, path.stem, source)


def gpu_spec(gpu: str) -> GPUSpec:
    if gpu not in GPUS:
        raise UserError(f"gpu: {gpu!r} is not one of {', '.join(GPUS)}", "gpu")
    return GPUS[gpu]


def framework_spec(framework: str) -> FrameworkSpec:
    if framework not in FRAMEWORKS:
        raise UserError(f"framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}", "framework")
    return FRAMEWORKS[framework]


def hf_profile(config: str | Path, gpu: str, name: str | None = None, dtype: str = "bf16",
               framework: str = FRAMEWORK.name) -> Profile:
    """The analytic profile of a Hugging Face config on `gpu` (a key of hardware.GPUS) with `dtype`'s GEMMs and
    `framework`'s constants, named GPU-STEM (-fp8) of the config file unless `name`."""
    return analytic_profile(gpu_spec(gpu), hf_model(config), framework_spec(framework), name=name, dtype=dtype)


def bundled_hf_profiles() -> list[Profile]:
    """The bundled HF-config profiles: every config of data/models on HF_BUNDLED_GPUS, bf16 and fp8."""
    return [hf_profile(path, gpu, dtype=dtype) for path in sorted(HF_CONFIGS_DIR.glob("*.json"))
            for gpu in HF_BUNDLED_GPUS for dtype in DTYPES]


def model_by_name(name: str) -> ModelSpec:
    """A model by the name published measurements use: a bundled LLaMA-2 key (hardware.MODELS) or the stem of a
    config under data/models/ or data/models/published/ (models of published measurements, not bundled profiles)."""
    if name in MODELS:
        return MODELS[name]
    for folder in (HF_CONFIGS_DIR, HF_CONFIGS_DIR / "published"):
        if (folder / f"{name}.json").exists():
            return hf_model(folder / f"{name}.json")
    raise UserError(f"model: {name!r} is not a bundled model ({', '.join(MODELS)}) nor a config under {HF_CONFIGS_DIR}",
                    "model")


def write_analytic_profiles(out_dir: Path = PROFILES_DIR) -> list[Path]:
    """Regenerate the bundled analytic profiles, LLaMA-2's and those of the bundled HF configs (deterministic:
    same bytes every run)."""
    paths = []
    for profile in analytic_profiles() + bundled_hf_profiles():
        path = Path(out_dir) / f"{profile.name}.json"
        write_model(path, profile)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------- listing / show
@dataclass(frozen=True)
class ProfileEntry:
    name: str  # what --profile accepts
    gpu: str
    model: str
    schemes: int
    source: str | None  # the profile's own word ("analytic", "measured", ...), if it says
    path: str


def list_bundled() -> list[ProfileEntry]:
    entries = []
    for path in bundled_profiles():
        p = load_model(Profile, path)
        entries.append(ProfileEntry(path.stem, p.gpu.name, p.model.name, len(p.schemes), p.source, str(path)))
    return entries
