"""Which way gradscape's imports run: `python tools/imports.py` prints the layers, every import against
them and every import cycle between packages. tests/test_layers.py fails on either; docs/architecture.md
draws the same layers.

Every import that runs counts: at the top of a module and inside a function (a lazy import is still a
dependency); one under `if TYPE_CHECKING:` is for the type checker only, runs nothing and is not counted.
A *unit* is a first-level package or module of `gradscape.tracer` or `gradscape.app`
(`gradscape.tracer.record`, `gradscape.tracer.store`), or one of gradscape/'s own. A unit may import a
unit of its own layer or a lower one, never a higher one; and no cycle may run through two units,
whatever their layers.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modules import ROOT, modules  # noqa: E402

T, A = "gradscape.tracer.", "gradscape.app."
# Lowest first. Names without a prefix are gradscape/'s own.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", [T + "_compat", T + "collector", "gradscape.tracer", "gradscape.app"]),
    ("model", [T + "_model", T + "report", T + "frames"]),
    ("forms", [T + "wire", T + "protocol"]),
    ("summaries", [T + "summary"]),
    ("recording", [T + "record"]),
    ("monitor", [T + "monitor"]),
    ("store", [T + "blobs", T + "store_tables", T + "step_doc", T + "index_store", T + "history_store", T + "store"]),
    ("sinks", [T + "sinks"]),
    ("tracer", [T + "tracing", T + "compare_step", T + "environment"]),
    ("view", [A + "view"]),
    ("page data", [A + "serving", A + "data", A + "step_flags", A + "export"]),
    ("server", [A + "server", A + "api", A + "ui"]),
    ("commands", [A + "notebook", A + "demo", A + "cli"]),
    ("public API", ["gradscape", "gradscape.__main__", "gradscape.integrations"]),
]

# Imports against the layers, or in a cycle, that are known and not yet fixed: (importer's unit, imported
# unit) -> why. None now (tests/test_layers.py holds it empty): the last three went with app/serving/ and
# record/debug/ (docs/architecture.md).
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str  # module
    imported: str  # module
    line: int

    def units(self) -> tuple[str, str]:
        return unit(self.importer), unit(self.imported)


def unit(module: str) -> str:
    parts = module.split(".")
    if parts[:2] in (["gradscape", "tracer"], ["gradscape", "app"]):
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def layer_of(u: str) -> int:
    for i, (_, units) in enumerate(LAYERS):
        if u in units:
            return i
    raise KeyError(f"{u} is in no layer of tools/imports.py's LAYERS: add it there and in docs/architecture.md")


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of `tree` but those in the body of an `if TYPE_CHECKING:` (its `else` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if _type_checking(node):
            assert isinstance(node, ast.If)
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _targets(name: str, path: Path, known: dict[str, Path]) -> Iterable[tuple[str, int]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            found = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in found:
            while target and target not in known:  # `import a.b.c` of a name inside a module: the module
                target = target.rpartition(".")[0]
            if target:
                yield target, node.lineno


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of one gradscape module by another (a module importing itself aside)."""
    known = modules(root)
    return sorted({Import(name, target, line) for name, path in known.items()
                   for target, line in _targets(name, path, known) if target != name},
                  key=lambda i: (i.importer, i.line, i.imported))


def upward(found: list[Import]) -> list[Import]:
    """The imports of a higher layer by a lower one, the allowed ones aside."""
    return [i for i in found if i.units()[0] != i.units()[1] and i.units() not in ALLOWED
            and layer_of(i.units()[1]) > layer_of(i.units()[0])]


def cycles(found: list[Import]) -> list[list[str]]:
    """The import cycles between units (strongly connected sets of more than one unit), the allowed
    imports aside: each as its sorted units."""
    graph: dict[str, set[str]] = {}
    for i in found:
        a, b = i.units()
        if a != b and (a, b) not in ALLOWED:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    return sorted(sorted(c) for c in _strongly_connected(graph) if len(c) > 1)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively (the graph has tens of units)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                out.append(component)
    return out


def render() -> str:
    """The layers, highest first, as docs/architecture.md draws them."""
    return "\n".join(f"{name:>10}: {', '.join(u.removeprefix('gradscape.') for u in units)}"
                     for name, units in reversed(LAYERS))


def main() -> int:
    found = imports()
    print(render())
    bad = upward(found)
    for i in bad:
        print(f"upward: {i.importer} imports {i.imported} (line {i.line})")
    loops = cycles(found)
    for c in loops:
        print(f"cycle of {len(c)} units: {', '.join(c)}")
    print(f"{len(found)} imports between {len(modules())} modules; {len(bad)} upward, {len(loops)} cycles, "
          f"{len(ALLOWED)} allowed")
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main())
