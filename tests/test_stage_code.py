"""Every DVC stage declares the code it runs: the static import closure of its command inside src/vcarepro.

A stage whose deps leave out a module it imports is not re-run when that module changes, so its outputs stop
following from the code while `dvc status` says they do (issue 25: prepare_gen imported vcarepro.params.config,
pipeline, io and errors and declared none of them).
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path
from typing import Iterator, List, Set

import pytest
import yaml

from helpers import ROOT

SRC = ROOT / "src"
PACKAGE = SRC / "vcarepro"


def module_file(name: str) -> Path | None:
    """The file of the vcarepro module ``name`` (a package's __init__.py), or None outside the package."""
    if name != "vcarepro" and not name.startswith("vcarepro."):
        return None
    path = SRC.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def _package_of(file: Path) -> str:
    parts = list(file.relative_to(SRC).with_suffix("").parts)
    return (
        ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1])
        if file.name != "__init__.py"
        else ".".join(parts[:-1])
    )


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` in ``package`` names (``from ...core.io`` in vcarepro.tools.bench:
    vcarepro.core.io)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(file: Path) -> Iterator[str]:
    """Every module ``file`` imports anywhere (a function's lazy import included), absolute names."""
    package = _package_of(file) if file.is_relative_to(SRC) else ""
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            prefix = _absolute(node, package)
            yield prefix
            for alias in node.names:  # `from vcarepro.train import seeds` imports the module seeds
                yield f"{prefix}.{alias.name}"


def closure(entry: Path) -> Set[Path]:
    """The files of src/vcarepro that running ``entry`` imports, following imports and parent packages."""
    seen: Set[Path] = set()
    todo: List[Path] = [entry]
    while todo:
        file = todo.pop()
        for name in imported_modules(file):
            parts = name.split(".")
            for k in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__, a/b/__init__ first
                found = module_file(".".join(parts[:k]))
                if found is not None and found not in seen:
                    seen.add(found)
                    todo.append(found)
    return seen


def stage_entries(cmd: str) -> List[Path]:
    """The scripts and modules a stage's command runs (stages/run.py's SCRIPT or -m MODULE, and a launched script)."""
    words = shlex.split(cmd)
    entries: List[Path] = []
    for k, word in enumerate(words):
        if word.endswith(".py") and word != "stages/run.py" and (ROOT / word).is_file():
            entries.append(ROOT / word)
        if word == "-m" and k + 1 < len(words):
            found = module_file(words[k + 1])
            if found is not None:
                entries.append(found)
    return entries


def stages():
    raw = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in raw.items():
        yield name, stage.get("do", stage)


@pytest.mark.parametrize("name,stage", list(stages()), ids=[name for name, _ in stages()])
def test_every_stage_declares_every_module_its_command_imports(name, stage):
    declared = [ROOT / dep for dep in stage.get("deps", []) if isinstance(dep, str) and "${" not in dep]
    entries = stage_entries(stage["cmd"])
    assert entries, f"{name}: no script found in its command"
    needed = set(entries)
    for entry in entries:
        needed |= closure(entry)
    missing = sorted(str(f.relative_to(ROOT)) for f in needed if not any(f == d or d in f.parents for d in declared))
    assert not missing, f"stage {name} runs code it does not declare as a dependency: {missing}"


def test_the_closure_follows_relative_lazy_and_parent_package_imports():
    seen = {str(f.relative_to(SRC)) for f in closure(ROOT / "stages" / "prepare_gen.py")}
    assert {
        "vcarepro/__init__.py",
        "vcarepro/params/config.py",
        "vcarepro/core/io.py",
        "vcarepro/core/errors.py",
        "vcarepro/core/numerics.py",
        "vcarepro/data/latents.py",
        "vcarepro/metrics/digit_features.py",
    } <= seen
    # vcarepro/__init__.py imports .models, whose registrations import the attention layers
    assert "vcarepro/models/__init__.py" in seen and "vcarepro/attention/vca.py" in seen


# -- every param a stage reads is declared ------------------------------------------------------------------------
# DVC re-runs a stage when a param it declares changes; a param it reads without declaring changes its outputs while
# `dvc status` says nothing changed (issue 27: eval_gen read fid_reference.batch_size undeclared). The reads are
# found statically: the whole params (``stage_params()`` / ``load_params()``) subscripted, ``.get`` or ``section``
# with a constant key, a section held in a variable and read the same way, and the whole params passed to a
# function of the stage or the package (resolved through the imports), followed into it under its argument's name.
# A section handed on whole (to a function that takes the section) counts as a read of the section, satisfied by any
# declared key under it.

PARAMS_SOURCES = ("stage_params", "load_params")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts) if path.is_relative_to(SRC) else [path.stem]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _scopes() -> dict:
    """module name -> (its functions by name, the names it imports from a module: name -> (module, name))."""
    scopes = {}
    for path in PACKAGE.rglob("*.py"):
        scopes[_module_name(path)] = _scope(path)
    return scopes


def _scope(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    functions, imported = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, node)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, package)
            for alias in node.names:
                imported[alias.asname or alias.name] = (source, alias.name)
    return tree, functions, imported


def _resolve(scopes: dict, module: str, name: str, depth: int = 0):
    """The definition (module, node) that ``name`` means in ``module``, following re-exports; None if unknown."""
    if module not in scopes or depth > 5:
        return None
    _, functions, imported = scopes[module]
    if name in functions:
        return module, functions[name]
    if name in imported:
        return _resolve(scopes, *imported[name], depth + 1)
    return None


def _const(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _callee(call: ast.Call) -> str | None:
    return (
        call.func.id
        if isinstance(call.func, ast.Name)
        else call.func.attr
        if isinstance(call.func, ast.Attribute)
        else None
    )


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) and _callee(node.value) == "parse_args":
        return f"args.{node.attr}"  # parser.parse_args().kind
    if isinstance(node, ast.Attribute) and _dotted(node.value):
        return f"{_dotted(node.value)}.{node.attr}"
    return None


def _walk(tree: ast.AST, known: dict) -> Iterator[ast.AST]:
    """ast.walk, but an ``if NAME == "value":`` whose NAME holds a known constant enters only the branch taken."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], (ast.Eq, ast.NotEq))
            and _dotted(node.test.left) in known
            and isinstance(node.test.comparators[0], ast.Constant)
        ):
            equal = known[_dotted(node.test.left)] == node.test.comparators[0].value
            todo.extend(node.body if equal == isinstance(node.test.ops[0], ast.Eq) else node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def params_read(
    tree: ast.AST,
    holders: Set[str],
    module: str,
    scopes: dict,
    seen: Set[tuple] | None = None,
    known: dict | None = None,
) -> Set[str]:
    """The dotted params keys ``tree`` (code of ``module``) reads, where the names in ``holders`` hold the params
    and ``known`` the names whose constant value decides a branch (a stage's ``--kind cls``, a ``branch="cls"``)."""
    seen = set() if seen is None else seen
    holders, sections, reads, known = set(holders), {}, set(), dict(known or {})

    def text(node) -> str | None:
        """A constant string, or an f-string of names whose values are known (``f"{branch}_runs"``)."""
        if isinstance(node, ast.JoinedStr):
            parts = [
                part.value if isinstance(part, ast.Constant) else known.get(_dotted(part.value)) for part in node.values
            ]
            return "".join(parts) if all(isinstance(part, str) for part in parts) else None
        return _const(node)

    def whole(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in holders) or (
            isinstance(node, ast.Call) and _callee(node) in PARAMS_SOURCES
        )

    def section_of(node) -> str | None:
        """The section ``node`` evaluates to: params["a"], params.get("a"), section(params, "a"), a variable."""
        if isinstance(node, ast.Name):
            return sections.get(node.id)
        if isinstance(node, ast.Subscript) and whole(node.value):
            return text(node.slice)
        if isinstance(node, ast.Call) and node.args:
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and whole(node.func.value):
                return text(node.args[0])
            if _callee(node) == "section" and len(node.args) == 2 and whole(node.args[0]):
                return text(node.args[1])
        return None

    for _ in range(2):  # a second pass sees the variables the first one bound
        for node in _walk(tree, known):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
                if _dotted(node.value) in known:
                    known[target] = known[_dotted(node.value)]
                elif whole(node.value):
                    holders.add(target)
                elif section_of(node.value):
                    sections[target] = section_of(node.value)
    for node in _walk(tree, known):
        name = section_of(node)
        if name and not isinstance(node, ast.Name):
            reads.add(name)
        if isinstance(node, ast.Subscript) and section_of(node.value) and text(node.slice):
            reads.add(f"{section_of(node.value)}.{text(node.slice)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and section_of(node.func.value)
            and text(node.args[0])
        ):
            reads.add(f"{section_of(node.func.value)}.{text(node.args[0])}")
        if (
            isinstance(node, ast.Call)
            and _callee(node) not in PARAMS_SOURCES + ("section",)
            and any(whole(arg) for arg in [*node.args, *(k.value for k in node.keywords)])
        ):
            found = _resolve(scopes, module, node.func.id) if isinstance(node.func, ast.Name) else None
            if found is None:
                continue
            owner, function = found
            takes = [a.arg for a in function.args.args + function.args.kwonlyargs]
            bound = {**dict(zip(takes, node.args)), **{k.arg: k.value for k in node.keywords if k.arg}}
            passed = {name for name, arg in bound.items() if whole(arg)}
            constants = {name: arg.value for name, arg in bound.items() if isinstance(arg, ast.Constant)}
            constants |= {name: known[_dotted(arg)] for name, arg in bound.items() if _dotted(arg) in known}
            key = (id(function), tuple(sorted(passed)), tuple(sorted(constants.items())))
            if key not in seen:
                seen.add(key)
                reads |= params_read(function, passed, owner, scopes, seen, constants)
    return reads


def _declares(declared: List[str], key: str) -> bool:
    """Whether a declared params entry covers ``key`` (``${...}`` matches any one name)."""
    for entry in declared:
        parts, wanted = entry.split("."), key.split(".")
        if all(p == w or p.startswith("${") for p, w in zip(parts, wanted)):
            if len(parts) <= len(wanted) or len(wanted) == 1:  # a whole section: any key declared under it
                return True
    return False


def stage_reads(stage) -> Set[str]:
    scopes = _scopes()
    words = shlex.split(stage["cmd"])
    # the command's constant options (``--kind cls``) as argparse gives them to the script
    options = {
        f"args.{word[2:].replace('-', '_')}": value
        for word, value in zip(words, words[1:])
        if word.startswith("--") and not value.startswith("--") and "${" not in value
    }
    reads: Set[str] = set()
    for entry in stage_entries(stage["cmd"]):
        module = _module_name(entry)
        scopes.setdefault(module, _scope(entry))
        reads |= params_read(scopes[module][0], set(), module, scopes, known=options)
    return reads - NOT_OUTPUTS.get(stage_name(stage), set())


# Reads that reach no output of the stage, so declaring them would only re-run it for nothing: a GenRun carries
# the sampling section, which training never uses (train/generation.py builds the model and the recipe).
NOT_OUTPUTS = {"train_gen": {"sampling"}}


def stage_name(stage) -> str:
    return next(name for name, candidate in stages() if candidate is stage or candidate == stage)


@pytest.mark.parametrize("name,stage", list(stages()), ids=[name for name, _ in stages()])
def test_every_param_a_stage_reads_is_declared(name, stage):
    declared = [p for p in stage.get("params", []) if isinstance(p, str)]
    missing = sorted(key for key in stage_reads(stage) if not _declares(declared, key))
    assert not missing, f"stage {name} reads params it does not declare in dvc.yaml: {missing}"


def test_the_reads_are_followed_through_sections_variables_and_the_package():
    stage = dict(stages())["train_cls"]
    reads = stage_reads(stage)
    # cls_run(params, run) -> _run, cls_recipe, section(...): the run's model, recipe and shape
    assert {
        "cls_runs",
        "models",
        "cls_shape",
        "cls_recipes",
        "cls_recipe_overrides",
        "distributed.seed_processes",
    } <= reads
    reads = stage_reads(dict(stages())["prepare_cls"])  # p = section(stage_params(), "prepare_cls"); p["..."]
    assert "prepare_cls.source" in reads
    # `--kind cls` in the command decides calibrate.py's `if kind == "cls"`: each kind reads only its own branch
    assert "cls_recipes" in stage_reads(dict(stages())["calibrate_cls"])
    assert "cls_recipes" not in stage_reads(dict(stages())["calibrate_gen"])
    assert "calibrate.sample_batch_size" in stage_reads(dict(stages())["calibrate_gen"])
    assert _declares(["cls_runs.${key}"], "cls_runs") and _declares(["eval_gen"], "eval_gen.prc_k")
    assert not _declares(["prepare_gen.fid_extractor"], "prepare_gen.vae")
    assert not _declares(["sampling"], "fid_reference.batch_size")
