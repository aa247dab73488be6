"""README.md and docs/formats.md stand alone and cannot drift: their file-format examples are valid files
that match the bundled profiles and the committed example run, their links resolve inside the repository,
and nothing points outside it."""

import json
import re

import pytest

from hydraplan.schema import Plan, Profile, Strategies
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile

MODELS = {"hydraplan.profile/v1": Profile, "hydraplan.strategies/v1": Strategies, "hydraplan.plan/v1": Plan}
DOCS = ["README.md", "docs/formats.md"]


def json_examples(doc: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", (ROOT / doc).read_text(), re.S)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_json_example_validates(doc):
    examples = json_examples(doc)
    assert sorted(e["schema"] for e in examples) == sorted(MODELS)
    for e in examples:
        MODELS[e["schema"]].model_validate(e)


def rounded_like(shown, actual) -> bool:
    """`shown` is `actual` rounded to the digits shown (floats), or equal (everything else)."""
    if isinstance(shown, dict):
        return all(k in actual and rounded_like(v, actual[k]) for k, v in shown.items())
    if isinstance(shown, list):
        return len(shown) == len(actual) and all(rounded_like(s, a) for s, a in zip(shown, actual))
    if isinstance(shown, float) and isinstance(actual, float):
        digits = len(repr(shown).split("e")[0].replace(".", "").replace("-", "").lstrip("0"))
        return float(f"{actual:.{max(digits, 1)}g}") == shown or round(actual, 4) == shown
    return shown == actual


@pytest.mark.parametrize("doc", DOCS)
def test_the_plan_example_is_iteration_0_of_the_committed_example_run(doc):
    (plan,) = [e for e in json_examples(doc) if e["schema"] == "hydraplan.plan/v1"]
    actual = json.loads((ROOT / "plans" / "example" / "iter_000000.json").read_text())
    assert set(plan) == set(actual) and rounded_like(plan, actual)


@pytest.mark.parametrize("doc", DOCS)
def test_the_profile_example_is_the_bundled_profile(doc):
    (shown,) = [e for e in json_examples(doc) if e["schema"] == "hydraplan.profile/v1"]
    bundled = load_profile(shown["name"]).model_dump(by_alias=True, exclude_none=True)
    schemes = {(s["tp"], s["pp"], s["cp"]): s for s in bundled["schemes"]}
    for s in shown["schemes"]:
        assert rounded_like(s, schemes[(s["tp"], s["pp"], s["cp"])])
    assert rounded_like({k: v for k, v in shown.items() if k != "schemes"}, bundled)


@pytest.mark.parametrize("doc", DOCS)
def test_nothing_points_outside_the_repository(doc):
    text = (ROOT / doc).read_text()
    assert "DESIGN.md" not in text and "../" not in text and "/work/" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert ((ROOT / doc).parent / target).exists(), f"{doc}: link to missing {target}"


def test_the_planner_snippet_prints_what_the_readme_says(tmp_path):
    """The `Planner` example, run on the demo's proposed strategies: each `# (...)` comment is the start
    of the value of the expression before it."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    run = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("RUN :="))
    strategies = tmp_path / "strategies.json"
    res = subprocess.run([str(Path(sys.executable).with_name("hydraplan")), "propose", *shlex.split(run.split(":=", 1)[1]),
                          "--out", str(strategies)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S) if "Planner(" in b
                and "micro_batches(" not in b]
    scope: dict = {}
    checked = 0
    for line in block.replace("plans/demo/strategies.json", str(strategies)).splitlines():
        code, _, comment = line.partition("#")
        expected = comment.strip()
        if expected[:1] in "([{'\"" and expected:
            assert repr(eval(code, scope)).startswith(expected.split("...")[0]), line
            checked += 1
        else:
            exec(code, scope)
    assert checked >= 1
