"""The package's import graph, built from the source with `ast` (imports inside functions included, relative imports
resolved), and the checks tests/project/test_layers.py makes of it against the layer table of docs/design.md: imports
point down, no packages import each other, no modules inside a package import each other in a cycle, and a package's
users reach only its public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path


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
