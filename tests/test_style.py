"""The field's habits, checked like the rest: ruff lints and formats src/, stages/ and tests/ with the
settings of pyproject.toml, and deptry finds every third-party import declared (src/ and stages/ against the
dependencies, tests/ against the dependencies and the test extra). Each test fails with the tool's own output.

ruff and deptry come with the test extra; they run as ``sys.executable -m ...`` so the venv's own copies answer.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import List

from helpers import ROOT

LINTED = ("src", "stages", "tests", "hydra_plugins")  # pyproject.toml's [tool.ruff] src, and the Hydra plugin DVC loads
PACKAGE = ("src", "stages")  # what the pipeline runs: its imports are the [project] dependencies
# deptry leaves out a folder named tests by default; the tests pass over tests/ names its own exclusions
TESTS_EXCLUDE = [r"(.*/)?__pycache__/"]


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def said(done: subprocess.CompletedProcess) -> str:
    return f"{' '.join(map(str, done.args[2:]))} (exit {done.returncode}):\n{done.stdout}{done.stderr}"


def python_files(*roots: str) -> List[str]:
    return sorted(
        str(p.relative_to(ROOT)) for root in roots for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts
    )


def test_ruff_check_finds_nothing():
    done = tool("ruff", "check", "--no-cache", "--output-format", "concise", *LINTED)
    assert done.returncode == 0, said(done)


def test_ruff_format_would_change_nothing():
    done = tool("ruff", "format", "--check", "--no-cache", *LINTED)
    assert done.returncode == 0, said(done)


def test_ruff_reads_every_python_file_of_the_linted_folders():
    """An exclude in pyproject.toml that swallowed a folder would make both checks above pass on nothing."""
    done = tool("ruff", "check", "--show-files", *LINTED)
    assert done.returncode == 0, said(done)
    shown = sorted(str(Path(line.strip()).relative_to(ROOT)) for line in done.stdout.splitlines() if line.strip())
    assert shown == python_files(*LINTED)


def deptry(*args: str) -> subprocess.CompletedProcess:
    done = tool("deptry", "--no-ansi", *args)
    scanned = re.search(r"Scanning (\d+) files?", done.stdout + done.stderr)
    assert scanned is not None, said(done)
    done.scanned = int(scanned.group(1))  # type: ignore[attr-defined]
    return done


def test_deptry_finds_every_import_of_the_package_and_stages_declared_and_every_dependency_imported():
    """DEP001 undeclared, DEP002 declared but never imported, DEP003 imported only through another dependency,
    DEP004 a test-extra package imported by the package (pyproject.toml's [tool.deptry] says the few exceptions)."""
    done = deptry(*PACKAGE)
    assert done.returncode == 0, said(done)
    assert done.scanned == len(python_files(*PACKAGE)), said(done)


def test_deptry_finds_every_import_of_the_tests_declared():
    """The tests may import the test extra (DEP004 does not apply) and need not import every dependency (DEP002);
    what they import must still be declared, in the dependencies or the test extra, not reached through another."""
    excludes = [arg for pattern in TESTS_EXCLUDE for arg in ("--exclude", pattern)]
    done = deptry("tests", *excludes, "--ignore", "DEP002,DEP004")
    assert done.returncode == 0, said(done)
    assert done.scanned == len(python_files("tests")), said(done)


def test_comments_in_the_code_explain_rather_than_narrate():
    """The tracker's history stays in the tracker: no comment or docstring in src/ or stages/ cites one of this
    project's issues (another repository's, as owner/name#N, is a citation)."""
    cited = [
        f"{path}:{number}: {line.strip()}"
        for path in python_files(*PACKAGE)
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if re.search(r"\bissues? #?\d+", line, re.IGNORECASE)
    ]
    assert not cited, "\n".join(cited)


def test_no_test_file_imports_another():
    """What the tests share lives in tests/helpers.py (and conftest.py's fixtures), so a test file can be read,
    moved or deleted on its own."""
    tests = {p.stem for p in (ROOT / "tests").glob("*.py")} - {"helpers", "conftest"}
    found = []
    for path in python_files("tests"):
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            found += [f"{path}:{node.lineno} imports {m}" for m in modules if m and m.split(".")[0] in tests]
    assert not found, "\n".join(found)
