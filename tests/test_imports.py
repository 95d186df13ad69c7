"""The package's import graph has no circle, counting imports inside functions too (a deferred
import that closes a circle only hides it): each module can be read knowing only what it imports.
No module takes another's underscore names, and no function grows past 50 statements (ruff's
PLR0915; the longer ones that exist are named below, and may only shrink)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lmlm"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports anywhere in its code, except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.add(full if full in modules else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, name, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_checker_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package():
    graph = import_graph()
    assert len(graph) > 100 and graph["lmlm.kb.build"] >= {"lmlm.kb.knowledge_base", "lmlm.kb.ingest"}
    assert circles(graph) == []


GROUND_FLOOR = ("lmlm.errors", "lmlm.device", "lmlm.jsonio", "lmlm.memory", "lmlm.pretrained", "lmlm.stages",
                "lmlm.recipe")
BARE = ("lmlm.errors", "lmlm.device", "lmlm.jsonio", "lmlm.memory")  # these import nothing from lmlm at all


def below(graph: dict[str, set[str]], name: str) -> set[str]:
    """Every package module ``name`` imports, directly or through others."""
    seen, todo = set(), [name]
    while todo:
        for m in graph[todo.pop()] - seen:
            seen.add(m)
            todo.append(m)
    return seen


def test_the_ground_floor_imports_nothing_above_it():
    graph = import_graph()
    packages = {m for m, path in ((_module_name(p), p) for p in PACKAGE.rglob("__init__.py")) if m != "lmlm"}
    for name in GROUND_FLOOR:
        up = sorted(m for m in below(graph, name) if any(m == p or m.startswith(p + ".") for p in packages))
        assert up == [], f"{name} imports from lmlm's subpackages: {up}"
    for name in BARE:
        assert graph[name] == set(), f"{name} imports {sorted(graph[name])}"
    assert below(graph, "lmlm.cli_errors") == {"lmlm.errors"}  # the CLI's error path: one type, no domain


def underscore_imports() -> list[str]:
    """``module: name`` for each ``from <package module> import _name`` in the package."""
    modules = set(import_graph())
    out = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            if target in modules:
                out += [f"{name}: {target}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_underscore_names():
    assert underscore_imports() == []


MAX_STATEMENTS = 50
LONGER = {  # function: its statements today; each may only shrink, and none may join
    "lmlm/annotate/wikipedia.py::annotate_article": 55,
    "lmlm/bench/generate_paper.py::_bench_model": 82,
    "lmlm/bench/train.py::run_train_bench": 57,
    "lmlm/evaluate/cli.py::tofu": 54,
    "lmlm/evaluate/perplexity.py::dynamic_perplexity": 55,
    "lmlm/generate/cli.py::generate_command": 82,
    "lmlm/generate/loop.py::decode": 55,
    "lmlm/pipeline/annotation.py::run_llm": 99,
    "lmlm/pipeline/report.py::_markdown": 51,
    "lmlm/serve/kb_routes.py::router": 77,
    "lmlm/train/inputs.py::open_inputs": 56,
}


def long_functions(root: Path = PACKAGE) -> dict[str, int]:
    """``path::function``: statements, for each function under ``root`` that ruff finds over ``MAX_STATEMENTS``."""
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "PLR0915", "--config",
                          f"lint.pylint.max-statements={MAX_STATEMENTS}", "--output-format", "json", str(root)],
                         capture_output=True, text=True)
    assert run.returncode in (0, 1), run.stderr
    out = {}
    for d in json.loads(run.stdout):
        path = Path(d["filename"])
        row = d["location"]["row"]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        name = next(n.name for n in ast.walk(tree)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno == row)
        out[f"{path.relative_to(root.parent).as_posix()}::{name}"] = int(re.search(r"\((\d+) >", d["message"])[1])
    return out


def test_the_length_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_STATEMENTS + 1))
    (pkg / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}")
    assert long_functions(pkg) == {"pkg/m.py::long": MAX_STATEMENTS + 1}


def test_no_function_grows_past_the_statement_limit():
    found = long_functions()
    grown = {f: (n, LONGER.get(f)) for f, n in found.items() if n > LONGER.get(f, MAX_STATEMENTS)}
    assert not grown, f"functions over {MAX_STATEMENTS} statements (now, allowed): {grown}"
