"""The package's layers (docs/design.md, "Layers"): imports point down, no packages import each other, no
modules inside a package import each other in a cycle, and tune and study use only the bench's public API.

The import graph (import_graph.py) is built from the source with `ast` (imports inside functions included, relative
imports resolved); the layer order is read from the table in docs/design.md, so the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from import_graph import import_graph, module_cycles, private_imports, read_layers, violations

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "relaxspec"
DESIGN = ROOT / "docs" / "design.md"


def test_the_package_follows_the_layer_table():
    layers = read_layers(DESIGN.read_text(encoding="utf-8"))
    graph = import_graph(SRC)
    assert violations(graph, layers) == []
    listed = {entry for row in layers for entry in row}
    assert listed == set(graph), f"table entries without source: {sorted(listed - set(graph))}"


def test_no_modules_of_a_package_import_each_other_in_a_cycle():
    assert module_cycles(SRC) == []


def test_tune_and_study_use_only_the_bench_s_public_api():
    assert private_imports(SRC, "bench", ("tune", "study")) == []


# ------------------------------------------------------------------ the checker on a package made here


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    top = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(text)
    return top


TABLE = """# design

## Layers

| layer | holds |
|---|---|
| `__init__.py`, `cli/` | cli |
| `high/` | top |
| `low/` | bottom |
| `base.py` | names |

## Next
"""


def test_read_layers_takes_the_table_rows_top_first():
    assert read_layers(TABLE) == [["__init__.py", "cli/"], ["high/"], ["low/"], ["base.py"]]
    with pytest.raises(ValueError):
        read_layers("## Layers\n\nno table\n")


def test_downward_imports_pass(tmp_path):
    top = _package(tmp_path, {
        "base.py": "X = 1\n",
        "low/__init__.py": "from pkg.base import X\n",
        "high/__init__.py": "from pkg.low import X\n",
        "cli/__init__.py": "def run():\n    from pkg.high import X\n",
    })
    graph = import_graph(top)
    assert graph["high/"] == {"low/": ["pkg/high/__init__.py:1"]}
    assert graph["cli/"] == {"high/": ["pkg/cli/__init__.py:2"]}
    assert violations(graph, read_layers(TABLE)) == []


def test_an_upward_import_inside_a_function_fails(tmp_path):
    top = _package(tmp_path, {
        "base.py": "",
        "high/__init__.py": "",
        "low/__init__.py": "",
        "low/mod.py": "def f():\n    from ..high import thing\n",  # relative, and inside a function
    })
    assert violations(import_graph(top), read_layers(TABLE)) == ["upward import: low/ imports high/ (pkg/low/mod.py:2)"]


def test_a_cycle_fails_even_within_one_row(tmp_path):
    table = TABLE.replace("| `high/` | top |", "| `high/`, `side/` | top |")
    top = _package(tmp_path, {
        "base.py": "",
        "low/__init__.py": "",
        "high/__init__.py": "import pkg.side\n",
        "side/__init__.py": "def f():\n    from pkg import high\n",
    })
    assert violations(import_graph(top), read_layers(table)) == ["import cycle between high/ side/"]


def test_the_cli_may_import_any_row_but_no_package_imports_it_and_a_package_without_a_row_fails(tmp_path):
    top = _package(tmp_path, {
        "base.py": "",
        "low/__init__.py": "",
        "cli/__init__.py": "",
        "cli/low.py": "import pkg.high\n",  # the CLI layer: may import any row
        "high/__init__.py": "from pkg.cli import low\n",  # ... but no package may import it
        "extra/__init__.py": "",
    })
    assert violations(import_graph(top), read_layers(TABLE)) == [
        "extra/ is not in the layer table",
        "upward import: high/ imports cli/ (pkg/high/__init__.py:1)",
        "import cycle between cli/ high/"]


def test_a_cycle_between_modules_inside_a_package_fails(tmp_path):
    top = _package(tmp_path, {
        "base.py": "",
        "low/__init__.py": "from pkg.low.a import A\n",
        "low/a.py": "A = 1\ndef f():\n    from pkg.low import b\n",  # inside a function: counts
        "low/b.py": "from .a import A\n",
        "high/__init__.py": "",
        "high/c.py": "from pkg.low.a import A\n",  # across packages: the layer table's business
    })
    assert module_cycles(top) == ["import cycle between low/a.py low/b.py (pkg/low/a.py:3, pkg/low/b.py:1)"]
    (top / "low" / "a.py").write_text("A = 1\n")
    assert module_cycles(top) == []


def test_an_import_past_a_package_s_public_api_fails(tmp_path):
    top = _package(tmp_path, {
        "base.py": "",
        "low/__init__.py": "from pkg.low.a import A, B\n__all__ = [\"A\"]\n",
        "low/a.py": "A = B = 1\n",
        "high/__init__.py": "",
        "high/good.py": "from pkg.low import A\nimport pkg.low\n",
        "high/also_good.py": "def f():\n    from pkg.low import A\n",  # inside a function: the public API too
    })
    assert private_imports(top, "low", ("high",)) == []
    (top / "high" / "bad.py").write_text("from pkg.low import B\ndef f():\n    from ..low.a import A\n"
                                         "import pkg.low.a\nfrom pkg.low import a\n")
    assert private_imports(top, "low", ("high",)) == [
        "pkg/high/bad.py:1: B is not in pkg.low.__all__",
        "pkg/high/bad.py:3: imports pkg.low.a, inside pkg.low (use its public API)",
        "pkg/high/bad.py:4: imports pkg.low.a, inside pkg.low (use its public API)",
        "pkg/high/bad.py:5: a is not in pkg.low.__all__"]


def test_a_public_module_offers_only_the_names_of_its_own_all(tmp_path):
    top = _package(tmp_path, {
        "base.py": "",
        "low/__init__.py": "from pkg.low import ns\n__all__ = [\"ns\"]\n",
        "low/ns.py": "A = B = 1\n__all__ = [\"A\"]\n",
        "high/__init__.py": "",
        "high/good.py": "from pkg.low import ns\nX = ns.A\ndef f(ns):\n    return ns.B\n",  # f's ns: not the module
        "high/local.py": "def f():\n    from ..low import ns as n\n    return n.A\n",
    })
    assert private_imports(top, "low", ("high",)) == []
    (top / "high" / "bad.py").write_text("from pkg.low import ns\nX = ns.B\ndef f():\n    from pkg.low import ns as n\n"
                                         "    return n.B\n")
    assert private_imports(top, "low", ("high",)) == ["pkg/high/bad.py:2: ns.B is not in pkg.low.ns.__all__",
                                                      "pkg/high/bad.py:5: n.B is not in pkg.low.ns.__all__"]
