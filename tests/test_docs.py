"""Every Markdown page (README.md and docs/*.md) stands alone and cannot drift: its file-format examples are
valid files that match the bundled profiles and the committed example run, its links resolve inside the
repository (headings included), the files and modules it names exist, and the `Planner` snippet prints
what it says. Each check finds its blocks wherever a page moved them."""

import importlib
import importlib.util
import json
import re

import pytest
from helpers import doc_pages, hp

from hydraplan.schema import Plan, Profile, Strategies
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile

MODELS = {"hydraplan.profile/v1": Profile, "hydraplan.strategies/v1": Strategies, "hydraplan.plan/v1": Plan}
PAGES = doc_pages()
FENCED = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
DEFINITION = re.compile(r"^\[[^\]\n]+\]: (\S+)(?: \"[^\"\n]*\")?[ \t]*$", re.M)  # a reference link's target


def text_of(page: str) -> str:
    return (ROOT / page).read_text()


def json_examples(page: str) -> list[dict]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text_of(page), re.S)]


def all_examples(schema: str) -> list[tuple[str, dict]]:
    return [(page, e) for page in PAGES for e in json_examples(page) if e["schema"] == schema]


def test_the_front_door_and_the_pages():
    """README.md is a front door of at most 300 lines; the rest lives in at least five docs/ pages."""
    assert PAGES[0] == "README.md" and len(text_of("README.md").splitlines()) <= 300
    assert len(PAGES) - 1 >= 5


@pytest.mark.parametrize("page", PAGES)
def test_every_json_example_validates(page):
    for e in json_examples(page):
        assert e["schema"] in MODELS, f"{page}: example of unknown schema {e['schema']}"
        MODELS[e["schema"]].model_validate(e)


def test_every_file_format_has_an_example():
    assert {e["schema"] for page in PAGES for e in json_examples(page)} == set(MODELS)


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


def test_every_plan_example_is_its_iteration_of_the_committed_example_run():
    examples = all_examples("hydraplan.plan/v1")
    assert len(examples) >= 1
    for page, plan in examples:
        actual = json.loads((ROOT / "plans" / "example" / f"iter_{plan['iteration']:06d}.json").read_text())
        assert set(plan) == set(actual) and rounded_like(plan, actual), f"{page}: plan example is stale"


def test_every_profile_example_is_the_bundled_profile():
    examples = all_examples("hydraplan.profile/v1")
    assert len(examples) >= 1
    for page, shown in examples:
        bundled = load_profile(shown["name"]).model_dump(by_alias=True, exclude_none=True)
        schemes = {(s["tp"], s["pp"], s["cp"], s.get("recompute", "none")): s for s in bundled["schemes"]}
        for s in shown["schemes"]:
            key = (s["tp"], s["pp"], s["cp"], s.get("recompute", "none"))
            assert rounded_like(s, schemes[key]), f"{page}: scheme {s} is stale"
        assert rounded_like({k: v for k, v in shown.items() if k != "schemes"}, bundled), page


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.*)$", FENCED.sub("", path.read_text()), re.M)}


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve_inside_the_repository(page):
    text = text_of(page)
    assert "DESIGN.md" not in text and "/work/" not in text
    prose = DEFINITION.sub("", LINK.sub("", text))
    assert "../" not in prose, f"{page}: a path outside the repository"
    here = (ROOT / page).parent
    checked = 0
    outside_code = FENCED.sub("", text)
    for target in LINK.findall(outside_code) + DEFINITION.findall(outside_code):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else (ROOT / page)
        assert file.is_relative_to(ROOT.resolve()), f"{page}: link {target} leaves the repository"
        assert file.exists(), f"{page}: link to missing {target}"
        if anchor:
            assert anchor in anchors(file), f"{page}: link {target}: no such heading"
        checked += 1
    assert page != "README.md" or checked >= 5
    if page == "README.md":
        assert "../" not in text


PLACEHOLDERS = ("NAME", "DIR", "NNNNNN", "TOKENS")
REPO_PATH = re.compile(r"(?<![\w./-])((?:planner|runtime|tests|bench|examples|profiles|data|docs)/[\w./-]*\w)(?![\w./*-])")
PY_FILES = {p.name for d in ("planner", "runtime", "tests", "bench", "examples") for p in (ROOT / d).rglob("*.py")}


def names(page: str) -> tuple[set[str], set[str], set[str]]:
    """Repository paths, bare `*.py` file names and `hydraplan.*` names a page quotes."""
    text = text_of(page)
    spans = re.findall(r"`([^`\n]+)`", FENCED.sub("", text))
    paths = {p for p in REPO_PATH.findall(LINK.sub("", text)) if not any(w in p for w in PLACEHOLDERS)}
    files = {s for s in spans if re.fullmatch(r"\w+\.py", s)}
    dotted = {s for s in spans if re.fullmatch(r"hydraplan(\.\w+)+", s)}
    return paths, files, dotted


def resolves(name: str) -> bool:
    """A module, or an attribute of one (hydraplan.Planner, hydraplan.loader.PlanLoader)."""
    try:
        if importlib.util.find_spec(name) is not None:
            return True
    except ModuleNotFoundError:
        pass
    module, _, attr = name.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attr)
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("page", PAGES)
def test_the_files_and_modules_a_page_names_exist(page):
    paths, files, dotted = names(page)
    assert paths or files or dotted
    for p in paths:
        assert (ROOT / p).exists(), f"{page}: names {p}, which does not exist"
    for f in files:
        assert f in PY_FILES, f"{page}: names {f}, which no module of the repository is"
    for d in dotted:
        assert resolves(d), f"{page}: names {d}, which does not import"


def test_the_name_checks_catch_a_stale_name(monkeypatch):
    """The checks above would fail on a moved module: the old flat layout's names do not resolve."""
    assert not (ROOT / "planner/iterate.py").exists() and not resolves("hydraplan.iterate")
    assert not resolves("hydraplan.cad") and resolves("hydraplan.solve.cad") and resolves("hydraplan.Planner")
    monkeypatch.setattr(
        "pathlib.Path.read_text", lambda self, *a, **k: "see `planner/iterate.py`, `iterate.py` and `hydraplan.iterate`"
    )
    paths, files, dotted = names("README.md")
    assert paths == {"planner/iterate.py"} and files == {"iterate.py"} and dotted == {"hydraplan.iterate"}
    assert "iterate.py" not in PY_FILES


def test_the_planner_snippet_prints_what_the_page_says(tmp_path):
    """The `Planner` example, run on the demo's proposed strategies: each `# (...)` comment is the start
    of the value of the expression before it."""
    import shlex

    run = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("RUN :="))
    strategies = tmp_path / "strategies.json"
    res = hp("propose", *shlex.split(run.split(":=", 1)[1]), "--out", strategies)
    assert res.returncode == 0, res.stderr
    (block,) = [b for page in PAGES for b in re.findall(r"```python\n(.*?)```", text_of(page), re.S)
                if "Planner(" in b and "micro_batches(" not in b]
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


def plan_table() -> list[tuple[list[str], str]]:
    """The plan fields of docs/formats.md with what `validate` says of them (required, required with a sync model,
    optional)."""
    text = text_of("docs/formats.md")
    section = text[text.index("## Plan:"):text.index("## Run summary")]
    rows = re.findall(r"^\| (`[^|]+`) \| (required|required with a sync model|optional) \|", section, re.M)
    return [(re.findall(r"`([^`]+)`", fields), status) for fields, status in rows]


def without(plan: dict, path: str) -> dict:
    """A copy of the plan file without the field at `path` (`a.b`, or `a[].b` in every element of list a)."""
    out = json.loads(json.dumps(plan))
    head, _, rest = path.partition(".")
    if head.endswith("[]") and rest:
        for item in out[head[:-2]]:
            item.pop(rest, None)
    elif head.endswith("[]"):
        out.pop(head[:-2], None)
    elif rest:
        out[head].pop(rest, None)
    else:
        out.pop(head, None)
    return out


def test_formats_md_says_what_validate_requires_of_a_plan():
    """Each plan field the table marks required makes `validate` fail when it is absent (a schema error or a
    violation); "required with a sync model" only against a profile that has one (cpu-tiny has); optional fields
    may be absent."""
    from hydraplan.app.validate import check_plan
    from hydraplan.core.sync import has_sync_model

    rows = plan_table()
    statuses = {status for _, status in rows}
    assert statuses == {"required", "required with a sync model", "optional"}
    plan = json.loads((ROOT / "plans" / "example" / "iter_000000.json").read_text())
    profile = load_profile("cpu-tiny")
    assert has_sync_model(profile)
    no_sync = profile.model_copy(update={"network": None})

    def problems(data: dict, prof) -> list:
        try:
            parsed = Plan.model_validate(data)
        except ValueError as e:  # pydantic: the field is required by the file format itself
            return [str(e)]
        return [v for v in check_plan(parsed, prof) if v.severity == "error"]

    # without a sync model the end-to-end fields may be absent and, present, must say no sync: the plan checked
    # against no_sync is the example without them
    bare = plan
    for fields, status in rows:
        for field in fields if status == "required with a sync model" else ():
            bare = without(bare, field)
    assert problems(plan, profile) == [] and problems(bare, no_sync) == []
    for fields, status in rows:
        for field in fields:
            cut = without(plan, field)
            if status == "required":
                assert problems(cut, profile) and problems(without(bare, field), no_sync), field
            elif status == "required with a sync model":
                assert problems(cut, profile), field
            else:
                assert not problems(cut, profile), field
