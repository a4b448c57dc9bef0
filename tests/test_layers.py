"""The package's layers (docs/design.md, "Layers"): imports point down, no packages import each other, no
modules inside a package import each other in a cycle, and tune and study use only the bench's public API.

The import graph is built from the source with `ast` (imports inside functions included, relative imports
resolved); the layer order is read from the table in docs/design.md, so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "relaxspec"
DESIGN = ROOT / "docs" / "design.md"


def read_layers(text: str) -> list[list[str]]:
    """The entries of each row of the "Layers" table, top row first: `pkg/` or `module.py`."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # after the header and |---|
    layers = [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows]
    if not layers or not all(layers):
        raise ValueError("docs/design.md: the Layers table has no rows, or a row without entries")
    return layers


def entry_of(path: Path, top: Path) -> str:
    """The layer-table entry a source file belongs to."""
    parts = path.relative_to(top).parts
    return parts[0] if len(parts) == 1 else parts[0] + "/"


def _module_entry(module: str, top: Path) -> str | None:
    """The entry of an imported module `relaxspec.x.y` (None: not this package's)."""
    parts = module.split(".")
    if parts[0] != top.name:
        return None
    if len(parts) == 1:
        return "__init__.py"
    return parts[1] + "/" if (top / parts[1]).is_dir() else parts[1] + ".py"


def _is_module(top: Path, module: str) -> bool:
    path = top.parent / module.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imports(path: Path, top: Path):
    """(module, [names] of `from module import names` or None for `import module`, line) of each import in `path`
    (a file under `top`, a package directory): relative imports resolved, imports inside functions included."""
    package = list(path.relative_to(top.parent).parts[:-1])  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            yield ".".join(x for x in (base, node.module or "") if x), [a.name for a in node.names], node.lineno


def module_imports(top: Path):
    """(file, imported module, "file:line") for every import of every .py file under `top` (a package directory):
    file relative to top's parent, imports inside functions included, relative imports resolved."""
    for path in sorted(top.rglob("*.py")):
        rel = path.relative_to(top.parent)
        for module, names, line in _imports(path, top):
            # `from pkg import sub` imports the submodule `pkg.sub` when there is one, else a name of `pkg`
            targets = [module] if names is None else \
                [f"{module}.{n}" if _is_module(top, f"{module}.{n}") else module for n in names]
            for target in targets:
                yield path, target, f"{rel}:{line}"


def import_graph(top: Path) -> dict[str, dict[str, list[str]]]:
    """{entry: {imported entry: ["file:line", ...]}} over every .py file under `top` (a package directory)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(top.rglob("*.py")):
        graph.setdefault(entry_of(path, top), {})
    for path, target, where in module_imports(top):
        source, entry = entry_of(path, top), _module_entry(target, top)
        if entry is not None and entry != source:
            graph[source].setdefault(entry, []).append(where)
    return graph


def _module_file(module: str, top: Path) -> Path | None:
    """The file of module `relaxspec.x.y` under top (x/y.py or x/y/__init__.py; None: not one of this package's)."""
    if module.split(".")[0] != top.name:
        return None
    path = top.parent / module.replace(".", "/")
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_graph(top: Path) -> dict[str, dict[str, list[str]]]:
    """{module file: {imported module file: ["file:line", ...]}} between the modules of each package under `top`
    (files relative to top; the package's __init__.py is one of its modules), imports inside functions included."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path, target, where in module_imports(top):
        found = _module_file(target, top)
        if path.parent == top or found is None or found == path or found.parent != path.parent:
            continue  # (the top level's modules are the layer table's entries, checked by import_graph)
        source = str(path.relative_to(top))
        graph.setdefault(source, {}).setdefault(str(found.relative_to(top)), []).append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every strongly connected set of two or more entries (each is a cycle of imports), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(graph: dict[str, dict[str, list[str]]], layers: list[list[str]]) -> list[str]:
    """Imports against the layer order (a lower row importing a higher one), entries missing from the table,
    and cycles between entries; one line each."""
    rank = {entry: len(layers) - i for i, row in enumerate(layers) for entry in row}  # bottom row: 1
    problems = [f"{entry} is not in the layer table" for entry in sorted(graph) if entry not in rank]
    for source, edges in sorted(graph.items()):
        for target, where in sorted(edges.items()):
            if source in rank and target in rank and rank[target] > rank[source]:
                problems.append(f"upward import: {source} imports {target} ({', '.join(where)})")
    problems += [f"import cycle between {' '.join(c)}" for c in cycles(graph)]
    return problems


def module_cycles(top: Path) -> list[str]:
    """Cycles of imports between the modules inside one package (imports inside functions count), one line each."""
    graph = module_graph(top)
    problems = []
    for c in cycles(graph):
        where = dict.fromkeys(w for a in c for b in c for w in graph.get(a, {}).get(b, []))  # (in order, once)
        problems.append(f"import cycle between {' '.join(c)} ({', '.join(where)})")
    return problems


def public_names(init: Path) -> set[str]:
    """The names a package's __init__.py lists in `__all__` (its public API)."""
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _binds(function, name: str) -> bool:
    """Whether a function (or lambda) binds `name` itself: an argument of that name, or one assigned in it."""
    args = function.args
    arguments = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
    return name in arguments or any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                                    for n in ast.walk(function))


def _attributes(scope, name: str):
    """The `name.attr` nodes under `scope`, less those in functions that bind `name` themselves."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and _binds(child, name):
            continue
        if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) and child.value.id == name:
            yield child
        yield from _attributes(child, name)


def _modules_imported(tree, path: Path, top: Path, package: str):
    """(scope, bound name, module) of each `from package import module [as bound]` in a file's tree (relative
    imports resolved): scope is the module, or the function the import is in; module is any name it imports."""
    base = list(path.relative_to(top.parent).parts[:-1])

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                start = ".".join(base[:len(base) - child.level + 1]) if child.level else ""
                if ".".join(x for x in (start, child.module or "") if x) == package:
                    yield from ((scope, a.asname or a.name, a.name) for a in child.names)
            yield from walk(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope)
    yield from walk(tree, tree)


def private_imports(top: Path, package: str, users: tuple[str, ...]) -> list[str]:
    """Imports of `package` (a package under `top`) by the modules of `users` (packages under `top`) that go past
    its public API: a module inside it, or a name its __init__.py does not list in `__all__`; and, of a module
    of it that `__all__` lists (`from package import module`, then `module.name`), a name that module's own
    `__all__` does not list; one line each."""
    name, public = f"{top.name}.{package}", public_names(top / package / "__init__.py")
    problems = []
    for path in sorted(p for user in users for p in (top / user).rglob("*.py")):
        for module, names, line in sorted(_imports(path, top), key=lambda found: found[2]):
            where = f"{path.relative_to(top.parent)}:{line}"
            if module == name:
                problems += [f"{where}: {n} is not in {name}.__all__" for n in names or () if n not in public]
            elif module.startswith(name + "."):
                problems.append(f"{where}: imports {module}, inside {name} (use its public API)")
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for scope, bound, module in _modules_imported(tree, path, top, name):
            source = top / package / f"{module}.py"
            if module not in public or not source.is_file():
                continue
            offered = public_names(source)
            problems += [f"{path.relative_to(top.parent)}:{node.lineno}: {bound}.{node.attr} is not in "
                         f"{name}.{module}.__all__" for node in _attributes(scope, bound) if node.attr not in offered]
    return problems


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
