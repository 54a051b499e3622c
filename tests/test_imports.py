"""The package's import graph, read from the source with ``ast`` (nothing imported): no circle, every arrow
points down the floors below, and the report reads files without loading the models.

An import inside a function counts like one at the top of a module: a lazy import that closes a circle is
still a circle in the design, only one that a test run may not trip over. The implicit import of a parent
package (``import vcarepro.io`` runs ``vcarepro/__init__.py``) is Python's, not an arrow of the design.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The floors, lowest first. A module stands on the floor of the longest name here that is it or a package above
# it, so a new module joins its package's floor (attention/grid.py: the layers'; report/rows.py: the report's).
# An import may point to its own floor or lower, never higher.
FLOORS: Tuple[Tuple[str, ...], ...] = (
    # 0. torch-free ground: errors, atomic writes and digests, the numerics profile, the names of choices,
    #    the sampling protocol, the launcher's process plumbing, what a long loop prints
    ("vcarepro.errors", "vcarepro.io", "vcarepro.integrity", "vcarepro.numerics", "vcarepro.attention_names",
     "vcarepro.protocol", "vcarepro.launch", "vcarepro.progress"),
    # 1. the attention layers; the datasets
    ("vcarepro.attention", "vcarepro.data"),
    # 2. the models (importing the package registers them with timm)
    ("vcarepro.models", "vcarepro"),
    # 3. what trains and measures them
    ("vcarepro.train", "vcarepro.metrics"),
    # 4. params.yaml onto the library: the schema checks a model's options against its constructor; what a
    #    stage's result depends on (its dvc.yaml definition, resolved over params.yaml)
    ("vcarepro.schema", "vcarepro.config", "vcarepro.pipeline", "vcarepro.provenance", "vcarepro.stage_facts"),
    # 5. released checkpoints; the report
    ("vcarepro.calibration", "vcarepro.report"),
    # 6. the tools on top
    ("vcarepro.bench", "vcarepro.standins", "vcarepro.export", "vcarepro.lockcheck", "vcarepro.preflight",
     "vcarepro.cluster"),
    # 7. the one command over them (vcarepro: runs each tool as python -m does, and explains a run's knobs)
    ("vcarepro.cli",),
)
# What the report must not load, at the top of any module it imports (a function may, e.g. to describe torch).
REPORT_MUST_NOT_LOAD = ("torch", "timm", "vcarepro.models", "vcarepro.train", "vcarepro.attention", "vcarepro.data")


def module_files(src: Path, package: str) -> Dict[str, Path]:
    """Every module of ``package`` under ``src``, by dotted name (a package by its own name)."""
    files = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _imports(tree: ast.AST, top_level_only: bool) -> Iterator[ast.stmt]:
    """The import statements of ``tree``; with ``top_level_only``, not those inside a function."""
    todo: List[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            elif not (top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
                todo.append(child)


def imported_names(name: str, path: Path, known: Set[str], top_level_only: bool = False) -> Iterator[str]:
    """The absolute names ``name`` (a module at ``path``) imports: a known module where the name is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _imports(ast.parse(path.read_text(), str(path)), top_level_only):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        submodules = [f"{prefix}.{alias.name}" for alias in node.names if f"{prefix}.{alias.name}" in known]
        yield from submodules  # `from vcarepro import numerics` needs vcarepro.numerics, not vcarepro's __init__
        if len(submodules) < len(node.names):
            yield prefix


def _owner(name: str, known: Set[str]) -> Optional[str]:
    """The known module that importing ``name`` runs last (``a.b.func`` -> ``a.b``), or None outside the package."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(src: Path, package: str, top_level_only: bool = False) -> Dict[str, Set[str]]:
    """module -> the modules of ``package`` it imports (itself and its parent packages' implicit runs left out)."""
    files = module_files(src, package)
    known = set(files)
    graph: Dict[str, Set[str]] = {}
    for name, path in files.items():
        targets = {_owner(imported, known) for imported in imported_names(name, path, known, top_level_only)}
        graph[name] = {t for t in targets if t is not None and t != name and not name.startswith(f"{t}.")}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def floor_of(module: str, floors=FLOORS) -> Optional[int]:
    best: Tuple[int, Optional[int]] = (-1, None)
    for level, names in enumerate(floors):
        for prefix in names:
            if (module == prefix or module.startswith(f"{prefix}.")) and len(prefix) > best[0]:
                best = (len(prefix), level)
    return best[1]


def upward_arrows(graph: Dict[str, Set[str]], floors=FLOORS) -> List[str]:
    return sorted(f"{a} (floor {floor_of(a, floors)}) -> {b} (floor {floor_of(b, floors)})"
                  for a, targets in graph.items() for b in targets if floor_of(b, floors) > floor_of(a, floors))


# -- the package ---------------------------------------------------------------------------------------------------

GRAPH = import_graph(SRC, "vcarepro")


def test_the_graph_is_read_from_the_source():
    assert {"vcarepro.config", "vcarepro.schema", "vcarepro.report.render", "vcarepro.models.dit"} <= set(GRAPH)
    assert "vcarepro.schema" in GRAPH["vcarepro.config"]       # stage_params validates
    assert "vcarepro.numerics" in GRAPH["vcarepro.errors"]     # a lazy import counts
    assert "vcarepro.numerics" in GRAPH["vcarepro.report.render"]  # `from .. import numerics`
    assert "vcarepro" not in GRAPH["vcarepro.report.render"]  # ... is not an arrow to the package's __init__


def test_no_module_imports_itself_back():
    assert cycles(GRAPH) == []


def test_every_module_stands_on_a_floor():
    assert [name for name in GRAPH if floor_of(name) is None] == []


def test_no_arrow_points_up_a_floor():
    assert upward_arrows(GRAPH) == []


def test_the_report_loads_neither_torch_nor_the_models_nor_training():
    """The report reads files (DESIGN.md: it never imports training code): what its modules import when they load,
    followed through every module of the package they reach, holds no torch, timm, layer, model, data or training
    module. (Importing any vcarepro module runs vcarepro/__init__.py, which registers the models: that is the
    package's doing, not the report's.)"""
    top = import_graph(SRC, "vcarepro", top_level_only=True)
    files = module_files(SRC, "vcarepro")
    reached = {name for name in top if name.startswith("vcarepro.report")}
    todo = list(reached)
    while todo:
        for target in top[todo.pop()]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    loaded = {imported for name in reached for imported in imported_names(name, files[name], set(files), True)}
    assert sorted(name for name in loaded | reached
                  if any(name == bad or name.startswith(f"{bad}.") for bad in REPORT_MUST_NOT_LOAD)) == []


# -- the checker itself, on a planted package --------------------------------------------------------------------

def _plant(tmp_path: Path, modules: Dict[str, str]) -> Path:
    for name, code in modules.items():
        path = tmp_path.joinpath(*name.split("."))
        path = path / "__init__.py" if name == "pkg" or name.endswith(".sub") else path.with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return tmp_path


def test_the_checker_finds_a_planted_circle_even_through_a_lazy_import(tmp_path):
    src = _plant(tmp_path, {
        "pkg": "",
        "pkg.low": "def f():\n    from pkg.high import g\n",
        "pkg.high": "from .low import f\n",
        "pkg.side": "from pkg import low\n",
    })
    graph = import_graph(src, "pkg")
    assert graph["pkg.side"] == {"pkg.low"}
    assert cycles(graph) == [["pkg.high", "pkg.low"]]
    assert cycles(import_graph(src, "pkg", top_level_only=True)) == []


def test_the_checker_finds_an_arrow_up_a_floor_and_places_new_modules_by_package(tmp_path):
    src = _plant(tmp_path, {
        "pkg": "",
        "pkg.base": "from pkg.sub.tool import x\n",
        "pkg.sub": "",
        "pkg.sub.tool": "from ..base import y\n",
    })
    floors = (("pkg.base",), ("pkg", "pkg.sub"))
    graph = import_graph(src, "pkg")
    assert floor_of("pkg.sub.tool", floors) == 1  # joins its package's floor
    assert upward_arrows(graph, floors) == ["pkg.base (floor 0) -> pkg.sub.tool (floor 1)"]
    assert cycles(graph) == [["pkg.base", "pkg.sub.tool"]]


@pytest.mark.parametrize("module, level", [("vcarepro.attention.grid", 1), ("vcarepro.report.rows", 5),
                                           ("vcarepro.report.card", 5), ("vcarepro.io", 0), ("vcarepro", 2)])
def test_new_and_old_modules_find_their_floor(module, level):
    assert floor_of(module) == level
