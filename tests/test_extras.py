"""The core install runs without the extras: the commands that need one stop at once with one line
naming it (``pip install 'lmlm[NAME]'``, exit code 2); the others work."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# the modules of the extras the core can do without (their imports fail in the child below)
EXTRA_MODULES = ("faker", "mwparserfromhell", "matplotlib", "bm25s", "rouge_score", "scipy", "ijson")


def _toml() -> dict:
    import tomllib

    return tomllib.loads(PYPROJECT.read_text())


def test_the_core_has_at_most_twelve_dependencies_and_test_pulls_every_extra():
    project = _toml()["project"]
    assert len(project["dependencies"]) <= 12
    extras = project["optional-dependencies"]
    pulled = extras["test"][0]
    assert pulled.startswith("lmlm[")
    named = set(pulled[len("lmlm["):-1].split(","))
    bundles = {name for name, reqs in extras.items() if all(r.startswith("lmlm[") for r in reqs)}
    assert set(extras) - {"test", "vllm"} - bundles <= named  # vLLM pins its own transformers: .ci/run's venv


def test_every_extra_is_named_in_the_readme():
    readme = (PYPROJECT.parent / "README.md").read_text()
    assert [name for name in _toml()["project"]["optional-dependencies"] if f"`{name}`" not in readme] == []


def test_without_the_extras_each_command_names_the_one_it_needs(tmp_path):
    (tmp_path / "t.jsonl").write_text(json.dumps({"entity": "Ada", "relation": "City", "value": "London"}) + "\n")
    (tmp_path / "a.json").write_text("{}")
    code = textwrap.dedent(f"""
        import sys
        for name in {EXTRA_MODULES!r}:
            sys.modules[name] = None  # as if not installed: importing it fails
        from lmlm.cli import main
        runs = {{
            "help": ["--help"],
            "quickstart": ["quickstart", "--out", "q"],
            "world": ["world", "w"],
            "build": ["kb", "build", "kb", "--triples", "t.jsonl", "--no-embed"],
            "authors": ["kb", "import", "kb", "a.json", "--format", "authors"],
        }}
        for name, argv in runs.items():
            print(name, main(argv), file=sys.stderr, flush=True)
    """)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    err = run.stderr
    assert run.returncode == 0, err
    assert "help 0" in err and "build 0" in err, err
    assert "error: lmlm quickstart needs faker: pip install 'lmlm[quickstart]'\nquickstart 2" in err
    assert "error: synthetic worlds needs faker: pip install 'lmlm[worlds]'\nworld 2" in err
    assert "pip install 'lmlm[authors]'\nauthors 2" in err
    assert not (tmp_path / "q").exists()  # stopped before any work


@pytest.mark.parametrize("module", ["faker", "scipy.stats"])
def test_need_imports_what_is_installed(module):
    from lmlm.errors import need

    assert need(module, "x", "y").__name__ == module
