"""`hydraplan doctor` on this machine's CPU (4 gloo ranks), as `make test` runs it: every check passes; and it
fails, exit 1 naming the check, when a backend or the runtime is broken on purpose."""

import json
import subprocess

import pytest
from helpers import hp

# Loaded at interpreter start (PYTHONPATH) in every rank: once hydraplan.runtime.attention is imported, its exact
# backend returns attention 0.1% too large -- a kernel that is slightly wrong, as a bad build would be.
BROKEN_BACKEND = '''
import importlib.abc, importlib.util, sys

class _Break(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "hydraplan.runtime.attention":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            exact = module.exact_window_attention
            module.exact_window_attention = lambda q, k, v, w: exact(q, k, v, w) * 1.001

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Break())
'''


def doctor(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`hydraplan doctor --json ARGS` in this process (its ranks are the processes it launches), GPUs hidden."""
    res = hp("doctor", "--json", "--device", "cpu", *args, env={"CUDA_VISIBLE_DEVICES": "", **env})
    return res, json.loads(res.stdout)


@pytest.mark.slow
def test_doctor_passes_on_cpu_with_four_gloo_ranks(forked_runtime):
    """Every check, its 4 ranks forked as tests/ranks.py does (the next test launches them with torchrun), with
    --quick: the activations check at 256 tokens instead of 2,048, where a layer keeps the same bytes per token
    (linear in the tokens; tests/test_saved.py measures at 64), so one keeping more or less than the model charges
    still fails it, in an eighth of the matmuls."""
    res, report = doctor("--quick")
    assert res.returncode == 0, res.stdout + res.stderr
    env = report["environment"]
    assert env["backend"] == "gloo" and env["ranks"] == 4 and env["dtype"] == "fp32"
    assert env["torch"] and env["attention"].startswith("sdpa-per-document")
    assert [c["check"] for c in report["checks"]] == ["attention", "collectives", "replay", "memory", "activations"]
    assert all(c["passed"] for c in report["checks"]) and report["passed"]
    replay = next(c["detail"] for c in report["checks"] if c["check"] == "replay")
    assert all(kind in replay for kind in ("plain", "TP+PP", "CP", "Seq1F1B", "CAD"))
    activations = next(c["detail"] for c in report["checks"] if c["check"] == "activations")
    assert activations.startswith("llama2-7b layer at 256 tokens") and activations.count(" TP") == 6


@pytest.mark.slow
def test_doctor_fails_naming_each_check_when_a_backend_is_broken_and_the_runtime_fails_inside_a_replay(tmp_path):
    """One job, two faults, each named against its own check: the attention check catches a slightly wrong kernel
    (the replay cannot: its fp64 reference attends with the same broken backend, so it checks the distribution,
    not the kernel); a communication error injected on rank 1 in the second plan ends the runtime job in one
    line, which the doctor reports against the replay check; the collectives still pass."""
    (tmp_path / "sitecustomize.py").write_text(BROKEN_BACKEND)
    res, report = doctor("--check", "attention", "--check", "collectives", "--check", "replay", PYTHONPATH=str(tmp_path),
                         HYDRAPLAN_INJECT_FAULT="comm@1:1")
    assert res.returncode == 1, res.stdout + res.stderr
    by = {c["check"]: c for c in report["checks"]}
    assert not by["attention"]["passed"] and by["attention"]["detail"].startswith("rank 0: sdpa-per-document, plain: ")
    assert by["collectives"]["passed"] and not report["passed"]
    assert not by["replay"]["passed"]
    assert by["replay"]["detail"].startswith("doctor: rank 1 on ") and "communication error" in by["replay"]["detail"]
