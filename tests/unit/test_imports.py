"""servetune's import graph has no circles, points only down its stages, and the modules a user runs do not import
vLLM or pytest.

The graph is read with `ast` from src/servetune: every import counts, at the top of a module or deferred inside a
function or an `if TYPE_CHECKING:` block; relative imports are resolved; `from pkg import name` is an edge to
`pkg.name` where that is a module, else to `pkg`. A package's `__init__` running before its submodule is not an
edge (else every package that re-exports from its own modules would be a circle). What a fresh Python imports:
tests/integration/test_imports_integration.py."""

import ast
from pathlib import Path

from support.paths import SRC


def module_name(path: Path, src: Path = SRC) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC, package: str = "servetune") -> dict[str, set[str]]:
    """Each module of `package` under `src` and the modules of `package` it imports."""
    files = {module_name(p, src): p for p in sorted((src / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # the package relative imports start in
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:  # `import servetune.a.b` of a name in a.b's namespace
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def test_the_graph_reader_sees_deferred_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import c\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("from ..b import x\nimport pkg.a\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.c"}, "pkg.b": {"pkg.a"}, "pkg.sub": {"pkg.sub.c"},
                     "pkg.sub.c": {"pkg.b", "pkg.a"}}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]


def test_no_import_circles_in_servetune():
    graph = import_graph()
    assert len(graph) > 30 and "servetune.tuner.loop" in graph["servetune.cli"]
    found = circles(graph)
    assert not found, "import circles in src/servetune:\n" + "\n".join(" <-> ".join(c) for c in found)


# servetune's stages, bottom first: a module imports modules of its own layer or of a lower one, never of a higher.
# A request's way: workload → load generator → measurement (metrics, verdict) → trial (engine + a level) → search
# → study; the tuner runs it all. Each entry is a module or a package (all the modules under it).
LAYERS = [
    ("servetune", "servetune.errors", "servetune.knobs", "servetune.jsonio", "servetune.safeyaml",
     "servetune.redact", "servetune.private", "servetune.interrupt", "servetune.timelimit", "servetune.tinymodel",
     "servetune.device"),
    ("servetune.workload",),
    ("servetune.loadgen",),
    ("servetune.engine",),
    ("servetune.measure",),
    ("servetune.study",),
    ("servetune.report",),
    ("servetune.search",),
    ("servetune.trial",),
    ("servetune.executors",),
    ("servetune.tuner",),
    ("servetune.testing",),
    ("servetune.demo", "servetune.verify"),
    ("servetune.options", "servetune.console"),
    ("servetune.cli", "servetune.__main__"),
]


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int | None:
    """The index of the layer whose longest entry is `module` or a package above it; None when none is."""
    best = max(((len(entry), i) for i, entries in enumerate(layers) for entry in entries
                if module == entry or module.startswith(entry + ".") and entry.count(".")), default=None)
    return best[1] if best else None


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Each import of a module in a higher layer than the importer's, as `importer -> imported`."""
    return sorted(f"{m} -> {e}" for m, edges in graph.items() for e in edges
                  if layer_of(e, layers) > layer_of(m, layers))


def test_the_layer_check_sees_an_import_that_points_up():
    layers = [("pkg", "pkg.base"), ("pkg.low",), ("pkg.high",)]
    graph = {"pkg": set(), "pkg.base": set(), "pkg.low": {"pkg.base"}, "pkg.low.a": {"pkg.low"},
             "pkg.high.b": {"pkg.low.a", "pkg.base"}}
    assert [layer_of(m, layers) for m in graph] == [0, 0, 1, 1, 2] and layer_of("other", layers) is None
    assert upward_imports(graph, layers) == []
    graph["pkg.base"].add("pkg.high.b")
    graph["pkg.low.a"].add("pkg.high.b")
    assert upward_imports(graph, layers) == ["pkg.base -> pkg.high.b", "pkg.low.a -> pkg.high.b"]


def test_every_module_has_a_layer_and_imports_point_down():
    graph = import_graph()
    assert [m for m in graph if layer_of(m) is None] == [], "add the new module to LAYERS"
    found = upward_imports(graph)
    assert not found, "imports of a higher layer (see LAYERS):\n" + "\n".join(found)


def test_only_servetune_testing_imports_servetune_testing():
    """It imports pytest, which servetune does not depend on."""
    graph = import_graph()
    assert "servetune.testing.executors" in graph
    assert [m for m, edges in graph.items() if not m.startswith("servetune.testing")
            and any(e.startswith("servetune.testing") for e in edges)] == []
