"""Fail on an import cycle between flightsrv's modules, or an import against the layering.

Layers, top to bottom (a module may import its own layer and the layers below it):

    cli, testing, __main__       command line; test helpers
    server                       Flight SQL
    warehouse (public API)       flightsrv.Warehouse / flightsrv.Table over the engine
    spark                        the PySpark data source (uses the public API)
    engine                       DuckDB decides
    sql                          sqlglot front end
    table                        the format (no SQL)
    store                        ObjectStore protocol and backends
    errors, runtime, telemetry   leaves

Imports inside ``if TYPE_CHECKING:`` blocks are ignored (they do not run). Imports inside
functions count: a late import is still a dependency.

    python tools/check_imports.py          # exit 1 and print the problems
    python tools/check_imports.py --root D # check the flightsrv package under D instead
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

LAYERS = {
    "flightsrv.errors": 0, "flightsrv.runtime": 0, "flightsrv.telemetry": 0,
    "flightsrv.store": 1,
    "flightsrv.table": 2,
    "flightsrv.sql": 3,
    "flightsrv.engine": 4,
    "flightsrv.spark": 5, "flightsrv.warehouse": 5, "flightsrv.demo": 5,
    "flightsrv.progress": 0,
    "flightsrv.server": 6,
    "flightsrv.cli": 7, "flightsrv.testing": 7, "flightsrv.__main__": 7, "flightsrv": 5,
}


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(mod: str) -> int | None:
    best = None
    for prefix, level in LAYERS.items():
        if mod == prefix or mod.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, level)
    return best[1] if best else None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: pathlib.Path, modules: set[str], root: pathlib.Path = ROOT) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.add(a.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in child.names:
                    full = f"{base}.{a.name}"
                    out.add(full if full in modules else base)
            visit(child)

    visit(tree)
    return {m for m in out if m.startswith("flightsrv")} - {me}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = pathlib.Path(argv[1]).resolve() if argv[:1] == ["--root"] and len(argv) > 1 \
        else ROOT
    files = sorted((root / "flightsrv").rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    graph = {module_name(f, root): {m for m in imports(f, modules, root)
                                    if m in modules or any(x.startswith(m + ".")
                                                           for x in modules)}
             for f in files}
    problems = []
    for mod, deps in sorted(graph.items()):
        lm = layer(mod)
        for dep in sorted(deps):
            ld = layer(dep)
            if lm is not None and ld is not None and ld > lm:
                problems.append(f"layering: {mod} (layer {lm}) imports {dep} (layer {ld})")
    # cycles (Tarjan's strongly connected components over modules)
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            strong(v)
    for comp in sccs:
        problems.append("cycle: " + " <-> ".join(comp))
    for p in problems:
        print(p)
    print(f"{len(graph)} modules, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
