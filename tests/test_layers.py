"""Imports point down only, and no two modules or folders import each other, however indirectly.

Layers, top to bottom: api (hydraplan/__init__, schema, loader) > app > runtime > job > methods > engine > solve >
store > core. A module may import its own layer or a lower one. Every import counts: at module level, inside
functions, under TYPE_CHECKING, relative, `from hydraplan import X` of a submodule X, and
`importlib.import_module("hydraplan. ...")` with a literal name. An import is an arrow to the module it names
(a package: its __init__), not to the packages around it, whose __init__ Python runs first: those import
nothing at import time (hydraplan/__init__ loads the Planner only when asked for it).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"hydraplan": REPO / "planner", "hydraplan.runtime": REPO / "runtime"}
LAYERS = ("core", "store", "solve", "engine", "methods", "job", "runtime", "app", "api")  # bottom to top
API = ("hydraplan", "hydraplan.schema", "hydraplan.loader")
FOLDER_LAYER = {"integrations": "app"}  # hydraplan.integrations (Megatron's schedulers) sits at the app level


@dataclass(frozen=True)
class Import:
    """One arrow: module `source` (in `path`, at `line`) reads module `target`."""

    source: str
    target: str
    path: Path
    line: int
    text: str  # the statement as written, for the message


def layer_of(module: str) -> str | None:
    """The layer of a hydraplan module by its folder; None: a module outside every layer."""
    if module in API:
        return "api"
    parts = module.split(".")
    folder = FOLDER_LAYER.get(parts[1], parts[1]) if len(parts) > 1 else None
    return folder if folder in LAYERS[:-1] else None


def module_files(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under each root (a package's __init__ is the package)."""
    out = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _resolve(name: str, modules: Mapping[str, Path]) -> str:
    """The module `name` reads: itself, else its longest prefix that is a module (an attribute of it)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _targets(node: ast.AST, module: str, is_package: bool, modules: Mapping[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module if is_package else module.rsplit(".", 1)[0]
            package = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{package}.{base}" if base else package
        for a in node.names:
            sub = f"{base}.{a.name}"
            yield sub if sub in modules else base
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)
          and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) in
               ("import_module", "__import__"))):
        yield node.args[0].value


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """ast.get_source_segment from the file's lines split once (it splits the whole file again on every call:
    most of this test's time before)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode()
    return b"".join([lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]]).decode()


def collect_imports(roots: Mapping[str, Path]) -> tuple[dict[str, Path], list[Import]]:
    """Every module under the roots, and every import of one of them by another (anywhere in a file)."""
    modules = module_files(roots)
    ours = {r.split(".")[0] for r in roots}
    arrows = set()
    for module, path in modules.items():
        source = path.read_text()
        lines = source.encode().splitlines(keepends=True)
        for node in ast.walk(ast.parse(source, str(path))):
            for name in _targets(node, module, path.name == "__init__.py", modules):
                target = _resolve(name, modules)
                if name.split(".")[0] in ours and target != module:
                    arrows.add(Import(module, target, path, node.lineno, _segment(lines, node) or name))
    return modules, sorted(arrows, key=lambda a: (str(a.path), a.line, a.target))


def _components(nodes: list[str], edges: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def _rel(path: Path, repo: Path) -> str:
    return str(path.relative_to(repo) if path.is_relative_to(repo) else path)


def _where(a: Import, repo: Path) -> str:
    text = " ".join(a.text.split()).replace("( ", "(").replace(", )", ")")
    return f"{_rel(a.path, repo)}:{a.line}: `{text}`"


def _cycles(what: str, arrows: list[Import], key: Callable[[str], str], repo: Path, advice: str) -> list[str]:
    """One message per cycle of the graph whose nodes are key(module): each arrow inside it, with the lines
    that make it (the first three)."""
    pairs: dict[tuple[str, str], list[Import]] = {}
    for a in arrows:
        if key(a.source) != key(a.target):
            pairs.setdefault((key(a.source), key(a.target)), []).append(a)
    edges: dict[str, set[str]] = {}
    for src, dst in pairs:
        edges.setdefault(src, set()).add(dst)
    out = []
    for comp in _components(sorted(set(edges) | {d for _, d in pairs}), edges):
        lines = ""
        for (src, dst), via in sorted(pairs.items()):
            if src in comp and dst in comp:
                more = f" (+{len(via) - 3} more)" if len(via) > 3 else ""
                lines += f"\n    {src} -> {dst}: " + "; ".join(_where(a, repo) for a in via[:3]) + more
        out.append(f"import cycle between {what} {', '.join(comp)}:{lines}\n  {advice}")
    return out


def layer_violations(modules: Mapping[str, Path], arrows: list[Import], repo: Path) -> list[str]:
    """Why the imports break the layering: (a) modules in no layer and upward arrows, (b) cycles between
    modules, (c) cycles between folders. Empty: the layering holds."""
    out = []
    for module, path in modules.items():
        if layer_of(module) is None:
            out.append(f"{_rel(path, repo)}: module {module} is in no layer; "
                       f"move it into a folder by role ({', '.join(LAYERS[:-1])}) or add it to the api ({', '.join(API)})")
    rank = {name: i for i, name in enumerate(LAYERS)}
    for a in arrows:
        src, dst = layer_of(a.source), layer_of(a.target)
        if src is not None and dst is not None and rank[dst] > rank[src]:
            allowed = ", ".join(LAYERS[: rank[src] + 1][::-1])
            out.append(f"{_where(a, repo)}: upward import: {a.source} ({src}) imports {a.target} ({dst}); {src} modules "
                       f"may import only {allowed}. Move what it uses down to {src} or below, or move the importing "
                       f"code up to {dst}")
    out += _cycles("modules", arrows, lambda m: m, repo,
                   "break it: move what both sides use into a module that neither imports back")
    folder = {m: _rel(p.parent, repo) for m, p in modules.items()}
    out += _cycles("folders", arrows, lambda m: folder[m], repo,
                   "break it: the arrows between these folders must all point one way (down the layers: turn "
                   "the upward imports named above)")
    return out


def check_layers(roots: Mapping[str, Path], repo: Path) -> list[str]:
    return layer_violations(*collect_imports(roots), repo)


def test_imports_point_down_without_cycles() -> None:
    problems = check_layers(ROOTS, REPO)
    for p in problems:
        print(p)
    assert not problems, f"{len(problems)} layering problems:\n" + "\n".join(problems)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_reports_upward_imports_and_cycles(tmp_path: Path) -> None:
    """A fake tree with one upward arrow (core -> engine, at module level) and two solve modules that import
    each other inside functions (one relatively, one through importlib): all three kinds are named."""
    planner, runtime = tmp_path / "planner", tmp_path / "runtime"
    for pkg in ("", "core/", "engine/", "solve/"):
        _write(planner, f"{pkg}__init__.py", "")
    _write(runtime, "__init__.py", "")
    _write(planner, "core/a.py", "import numpy\n\nfrom hydraplan.engine.b import B\n")
    _write(planner, "engine/b.py", "from hydraplan.core import a\n\nB = 1\n")
    _write(planner, "solve/c.py", "def f():\n    from . import d\n    return d\n")
    _write(planner, "solve/d.py", "def g():\n    import importlib\n    return importlib.import_module('hydraplan.solve.c')\n")
    _write(runtime, "r.py", "from hydraplan import solve\nfrom hydraplan.core.a import nothing\n")
    _write(planner, "stray.py", "")
    problems = check_layers({"hydraplan": planner, "hydraplan.runtime": runtime}, tmp_path)
    text = "\n".join(problems)
    assert "planner/core/a.py:3: `from hydraplan.engine.b import B`: upward import: hydraplan.core.a (core) imports " \
           "hydraplan.engine.b (engine); core modules may import only core." in text
    assert "import cycle between modules hydraplan.solve.c, hydraplan.solve.d:" in text
    assert "hydraplan.solve.c -> hydraplan.solve.d: planner/solve/c.py:2: `from . import d`" in text
    assert "hydraplan.solve.d -> hydraplan.solve.c: planner/solve/d.py:3: `importlib.import_module('hydraplan.solve.c')`" \
        in text
    assert "import cycle between modules hydraplan.core.a, hydraplan.engine.b:" in text
    assert "import cycle between folders planner/core, planner/engine:" in text
    assert "module hydraplan.stray is in no layer" in text
    # the runtime's imports point down (a package, then an attribute of a module): no message names it
    assert "runtime/r.py" not in text
    assert len(problems) == 5, text
