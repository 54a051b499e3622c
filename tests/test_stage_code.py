"""Every DVC stage declares the code it runs: the static import closure of its command inside src/vcarepro.

A stage whose deps leave out a module it imports is not re-run when that module changes, so its outputs stop
following from the code while `dvc status` says they do (issue 25: prepare_gen imported vcarepro.config,
pipeline, io and errors and declared none of them).
"""
from __future__ import annotations

import ast
import shlex
from pathlib import Path
from typing import Iterator, List, Set

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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
    return ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1]) if file.name != "__init__.py" \
        else ".".join(parts[:-1])


def imported_modules(file: Path) -> Iterator[str]:
    """Every module ``file`` imports anywhere (a function's lazy import included), absolute names."""
    package = _package_of(file) if file.is_relative_to(SRC) else ""
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
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
    missing = sorted(str(f.relative_to(ROOT)) for f in needed
                     if not any(f == d or d in f.parents for d in declared))
    assert not missing, f"stage {name} runs code it does not declare as a dependency: {missing}"


def test_the_closure_follows_relative_lazy_and_parent_package_imports():
    seen = {str(f.relative_to(SRC)) for f in closure(ROOT / "stages" / "prepare_gen.py")}
    assert {"vcarepro/__init__.py", "vcarepro/config.py", "vcarepro/io.py", "vcarepro/errors.py",
            "vcarepro/numerics.py", "vcarepro/data/latents.py", "vcarepro/metrics/digit_features.py"} <= seen
    # vcarepro/__init__.py imports .models, whose registrations import the attention layers
    assert "vcarepro/models/__init__.py" in seen and "vcarepro/attention/vca.py" in seen
