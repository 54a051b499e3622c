"""The package's import graph, read from the source with ``ast`` (nothing imported): no circle, every arrow
points down the floors below, and the report reads files without loading the models.

An import inside a function counts like one at the top of a module: a lazy import that closes a circle is
still a circle in the design, only one that a test run may not trip over. The implicit import of a parent
package (``import vcarepro.core.io`` runs ``vcarepro/__init__.py``) is Python's, not an arrow of the design.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from helpers import ROOT, read_floors

SRC = ROOT / "src"


# The floors, lowest first, read from the folders (src/vcarepro/*/__init__.py: FLOOR = N). A module stands on the
# floor of its folder (attention/grid.py: the layers'; report/rows.py: the report's). An import may point to its own
# floor or lower, never higher. The package face (vcarepro/__init__.py) imports nothing when it loads and the
# attention layer when `vcarepro.VisualContrastAttention` is first asked for: it stands on the layers' floor.
FOLDER_FLOORS = read_floors(SRC, "vcarepro")
FACE_FLOOR = FOLDER_FLOORS["vcarepro.attention"]
FLOORS: Tuple[Tuple[str, ...], ...] = tuple(
    tuple(sorted(name for name, floor in FOLDER_FLOORS.items() if floor == level))
    + (("vcarepro",) if level == FACE_FLOOR else ())
    for level in range(max(f for f in FOLDER_FLOORS.values() if f is not None) + 1)
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
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        submodules = [f"{prefix}.{alias.name}" for alias in node.names if f"{prefix}.{alias.name}" in known]
        yield from submodules  # `from vcarepro import numerics` needs vcarepro.core.numerics, not vcarepro's __init__
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
    return sorted(
        f"{a} (floor {floor_of(a, floors)}) -> {b} (floor {floor_of(b, floors)})"
        for a, targets in graph.items()
        for b in targets
        if floor_of(b, floors) > floor_of(a, floors)
    )


# -- the package ---------------------------------------------------------------------------------------------------

GRAPH = import_graph(SRC, "vcarepro")


def test_the_graph_is_read_from_the_source():
    assert {"vcarepro.params.config", "vcarepro.params.schema", "vcarepro.report.render", "vcarepro.models.dit"} <= set(
        GRAPH
    )
    assert "vcarepro.params.schema" in GRAPH["vcarepro.params.config"]  # stage_params validates
    assert "vcarepro.core.numerics" in GRAPH["vcarepro.core.errors"]  # a lazy import counts
    assert "vcarepro.core.numerics" in GRAPH["vcarepro.report.render"]  # `from .. import numerics`
    assert "vcarepro" not in GRAPH["vcarepro.report.render"]  # ... is not an arrow to the package's __init__


def test_every_folder_declares_its_floor_and_no_floor_is_empty():
    assert [name for name, floor in FOLDER_FLOORS.items() if not isinstance(floor, int)] == []
    assert all(FLOORS), FLOORS  # floors 0..top, each holding at least one folder


def test_no_module_stands_outside_a_folder():
    """The top of the package is its face alone: every module lives in the folder of its floor."""
    assert sorted(p.name for p in (SRC / "vcarepro").glob("*.py")) == ["__init__.py"]


def test_every_module_compiles():
    """The graph is read with ast.parse, which takes what Python will not run: a ``from __future__`` import after
    ``FLOOR = N`` parses, and only the compiler refuses it. So every module is compiled too (nothing imported)."""
    refused = []
    for name, path in module_files(SRC, "vcarepro").items():
        try:
            compile(path.read_text(), str(path), "exec", dont_inherit=True)
        except SyntaxError as error:
            refused.append(f"{name}: {error}")
    assert refused == []


def test_importing_the_package_or_its_ground_loads_neither_torch_nor_timm():
    """The face is lazy, and the torch-free modules are torch-free when imported (stages/run.py imports
    vcarepro.core.numerics before torch loads; the report's readers follow the protocol module)."""
    import subprocess
    import sys

    code = (
        "import sys, vcarepro, vcarepro.core.numerics, vcarepro.core.choices, vcarepro.metrics.protocol, "
        "vcarepro.train.launch, vcarepro.tools.cli; "
        "print(sorted(m for m in ('torch', 'timm', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # the report's whole page, imported for real: no torch, timm, model or training module
    code = (
        "import sys, vcarepro.report.render; print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'timm') or m.startswith(('vcarepro.models', 'vcarepro.train', 'vcarepro.attention'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_module_imports_itself_back():
    assert cycles(GRAPH) == []


def test_every_module_stands_on_a_floor():
    assert [name for name in GRAPH if floor_of(name) is None] == []


def test_no_arrow_points_up_a_floor():
    assert upward_arrows(GRAPH) == []


def test_the_report_loads_neither_torch_nor_the_models_nor_training():
    """The report reads files and never imports training code: what its modules import when they load, followed
    through every module of the package they reach, holds no torch, timm, layer, model, data or training module."""
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
    assert (
        sorted(
            name
            for name in loaded | reached
            if any(name == bad or name.startswith(f"{bad}.") for bad in REPORT_MUST_NOT_LOAD)
        )
        == []
    )


# -- the checker itself, on a planted package --------------------------------------------------------------------


def _plant(tmp_path: Path, modules: Dict[str, str]) -> Path:
    for name, code in modules.items():
        path = tmp_path.joinpath(*name.split("."))
        path = path / "__init__.py" if name == "pkg" or name.endswith(".sub") else path.with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return tmp_path


def test_the_checker_finds_a_planted_circle_even_through_a_lazy_import(tmp_path):
    src = _plant(
        tmp_path,
        {
            "pkg": "",
            "pkg.low": "def f():\n    from pkg.high import g\n",
            "pkg.high": "from .low import f\n",
            "pkg.side": "from pkg import low\n",
        },
    )
    graph = import_graph(src, "pkg")
    assert graph["pkg.side"] == {"pkg.low"}
    assert cycles(graph) == [["pkg.high", "pkg.low"]]
    assert cycles(import_graph(src, "pkg", top_level_only=True)) == []


def test_the_checker_finds_an_arrow_up_a_floor_and_places_new_modules_by_package(tmp_path):
    src = _plant(
        tmp_path,
        {
            "pkg": "",
            "pkg.base": "from pkg.sub.tool import x\n",
            "pkg.sub": "",
            "pkg.sub.tool": "from ..base import y\n",
        },
    )
    floors = (("pkg.base",), ("pkg", "pkg.sub"))
    graph = import_graph(src, "pkg")
    assert floor_of("pkg.sub.tool", floors) == 1  # joins its package's floor
    assert upward_arrows(graph, floors) == ["pkg.base (floor 0) -> pkg.sub.tool (floor 1)"]
    assert cycles(graph) == [["pkg.base", "pkg.sub.tool"]]


@pytest.mark.parametrize(
    "module, level",
    [
        ("vcarepro.attention.grid", 1),
        ("vcarepro.report.rows", 5),
        ("vcarepro.report.card", 5),
        ("vcarepro.core.io", 0),
        ("vcarepro", 1),
        ("vcarepro.tools.cli", 6),
        ("vcarepro.params.runs", 4),
    ],
)
def test_new_and_old_modules_find_their_floor(module, level):
    assert floor_of(module) == level
