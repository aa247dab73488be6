"""data/published/: every source file validates, names GPUs and models hydraplan has, describes a layout that adds
up, and together they meet issue 46's floor; data/published/README.md lists each file with its point count."""

import re
from collections import Counter

import pytest

from hydraplan.core.hardware import GPUS, MODELS
from hydraplan.core.published import IterationConfig, KernelConfig, PublishedFile
from hydraplan.store.fileio import load_model
from hydraplan.store.paths import DATA_DIR
from hydraplan.store.profiles import HF_CONFIGS_DIR, read_hf_config

PUBLISHED = DATA_DIR / "published"
FILES = sorted(PUBLISHED.glob("*.json"))
MODEL_DIRS = (HF_CONFIGS_DIR, HF_CONFIGS_DIR / "published")


@pytest.fixture(scope="module")
def loaded() -> dict[str, PublishedFile]:
    return {path.stem: load_model(PublishedFile, path) for path in FILES}


def test_each_file_validates_with_unique_ids(loaded):
    for name, pf in loaded.items():
        ids = [p.id for p in pf.points]
        assert len(ids) == len(set(ids)), f"{name}: repeated ids {[i for i, n in Counter(ids).items() if n > 1]}"


def test_every_point_names_a_known_gpu(loaded):
    for name, pf in loaded.items():
        for p in pf.points:
            assert p.config.gpu in GPUS, f"{name}/{p.id}: gpu {p.config.gpu!r}"


def test_every_iteration_model_resolves_to_a_config(loaded):
    """A bundled model key, or a Hugging Face config that parses (data/models/ or data/models/published/)."""
    for name, pf in loaded.items():
        for p in pf.points:
            if isinstance(p.config, IterationConfig) and p.config.model not in MODELS:
                paths = [d / f"{p.config.model}.json" for d in MODEL_DIRS if (d / f"{p.config.model}.json").exists()]
                assert len(paths) == 1, f"{name}/{p.id}: model {p.config.model!r} resolves to {paths}"
                read_hf_config(paths[0])


def test_iteration_layouts_add_up(loaded):
    """tp x pp x cp x dp is the GPU count, and the global batch splits into whole micro-batches per replica."""
    for name, pf in loaded.items():
        for p in pf.points:
            c = p.config
            if isinstance(c, IterationConfig):
                assert c.tp * c.pp * c.cp * c.dp == c.gpus, f"{name}/{p.id}"
                assert c.global_batch % (c.dp * c.micro_batch) == 0, f"{name}/{p.id}"


def test_kernel_shapes_are_consistent(loaded):
    for name, pf in loaded.items():
        for p in pf.points:
            c = p.config
            if isinstance(c, KernelConfig) and c.heads and c.hidden:
                assert c.heads * c.head_dim == c.hidden, f"{name}/{p.id}"


def test_the_floor_of_issue_46(loaded):
    """At least 40 points from at least 4 sources, with kernels, iterations and collectives all present."""
    points = [p for pf in loaded.values() for p in pf.points]
    assert len(points) >= 40 and len(loaded) >= 4
    assert {p.config.kind for p in points} == {"kernel", "iteration", "collective"}


def test_readme_lists_every_file_with_its_point_count(loaded):
    text = (PUBLISHED / "README.md").read_text()
    rows = dict(re.findall(r"^\| \[?`?([\w.-]+)\.json`?\]?[^|]*\|(?:[^|\n]*\|){2} *(\d+) *\|", text, re.M))
    assert rows == {name: str(len(pf.points)) for name, pf in loaded.items()}
