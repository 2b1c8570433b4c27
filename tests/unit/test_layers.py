"""The import graph of server_py/rmscore against its layer order (docs/architecture.md, "Layers").

Every module is parsed with `ast`, and every import it writes counts: at module level, inside a
function or a class, under `if TYPE_CHECKING`. An import may point to the importer's own layer or
below, never up; and no two modules, nor two folders, may import each other round a circle.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

PACKAGE = "rmscore"
SRC = pathlib.Path(__file__).resolve().parents[2] / "server_py" / PACKAGE

#: Highest first. A part is a folder of server_py/rmscore, or a module at its top (`cli`); `rmscore`
#: is the package's own __init__. A part may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),          # the `rmscore` command
    ("frontends",),    # transports and the process runner: they compose a core with a runtime
    ("runtimes",),     # model runtimes: implement what core/runtime.py asks for
    ("core",),         # transport-free serving: config, batcher, planner, ScoringCore
    ("model",),        # the model repository: export, reader, padding, precision gate
    ("v1",),           # the server's gRPC stubs, generated from proto/ (scripts/gen_proto.sh)
    (PACKAGE,),        # rmscore/__init__.py
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


@dataclass(frozen=True)
class Import:
    src: str
    dst: str
    line: int
    nested: bool  # inside a function or class body

    def where(self) -> str:
        return f"{self.src} -> {self.dst} (line {self.line}{', in a function' if self.nested else ''})"


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def _targets(node: ast.AST, src: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of the tree an import statement loads: `from X import y` is X.y where that is a
    module, else X; a relative import is resolved against the importer's package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = src.split(".") if is_package else src.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def imports() -> list[Import]:
    """Every import of a module of the tree by another, once per statement and target."""
    mods = modules()
    known = set(mods)
    out: dict[Import, None] = {}
    for src, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        nested_lines = {n.lineno for scope in ast.walk(tree)
                        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                        for n in ast.walk(scope) if isinstance(n, (ast.Import, ast.ImportFrom)) and n is not scope}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for dst in _targets(node, src, path.name == "__init__.py", known):
                # `import rmscore.core.config` or a name of the package: the deepest module of the tree it names.
                while dst and dst not in known and dst.startswith(PACKAGE + "."):
                    dst = dst.rsplit(".", 1)[0]
                if dst in known and dst != src:
                    out[Import(src, dst, node.lineno, node.lineno in nested_lines)] = None
    return list(out)


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_every_part_has_a_layer():
    unplaced = sorted({part_of(m) for m in modules()} - set(RANK))
    assert not unplaced, f"place these in LAYERS (and in docs/architecture.md, 'Layers'): {unplaced}"


def test_the_graph_is_drawn():
    # The parser sees both kinds of import: a module-level one and one inside a function.
    found = {(i.src, i.dst, i.nested) for i in imports()}
    assert ("rmscore.frontends.grpc_server", "rmscore.core.scoring", False) in found
    assert ("rmscore.frontends.cli", "rmscore.frontends.grpc_server", True) in found


def test_no_import_points_up():
    up = [i.where() + f": {part_of(i.src)} imports {part_of(i.dst)}, a higher layer"
          for i in imports() if RANK[part_of(i.dst)] < RANK[part_of(i.src)]]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up)


def test_no_circle_between_modules():
    found = imports()
    circles = cycles({(i.src, i.dst) for i in found})
    detail = [i.where() for c in circles for i in found if i.src in c and i.dst in c]
    assert not circles, f"modules that import each other round a circle: {circles}\n" + "\n".join(detail)


def test_no_circle_between_folders():
    by_pair: dict[tuple[str, str], list[Import]] = {}
    for i in imports():
        if part_of(i.src) != part_of(i.dst):
            by_pair.setdefault((part_of(i.src), part_of(i.dst)), []).append(i)
    circles = cycles(set(by_pair))
    detail = [f"{a} -> {b}: {len(found)} imports, e.g. {found[0].where()}"
              for c in circles for (a, b), found in sorted(by_pair.items()) if a in c and b in c]
    assert not circles, f"folders that import each other round a circle: {circles}\n" + "\n".join(detail)


#: The distributions point one way too: the tools start and drive the server and the client; the
#: server and the client never import the tools (the tools are not installed in the serving image).
DISTRIBUTIONS = {"rmscore_client": pathlib.Path(__file__).resolve().parents[2] / "client" / "rmscore_client",
                 PACKAGE: SRC}


def test_no_distribution_imports_the_tools():
    found = []
    for name, root in DISTRIBUTIONS.items():
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(root.parent)}:{node.lineno} imports {n}"
                          for n in names if n.split(".")[0] == "rmscore_tools"]
    assert not found, found
