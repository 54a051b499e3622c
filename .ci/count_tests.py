#!/usr/bin/env python3
"""Count the test suite's size from its source: test functions, assert statements and pytest.raises checks.

`python .ci/count_tests.py [DIR]` (DIR defaults to this repository's tests/). Read with ast, so nothing is
imported or run; a parametrized test counts once here (`pytest --collect-only -q` counts its cases). Issue 41
asks for the suite's size before and after a speed-up: the counts must not fall where no test was merged.
"""

import ast
import sys
from pathlib import Path


def count(directory: Path) -> dict[str, int]:
    totals = {"python files": 0, "test functions": 0, "asserts": 0, "pytest.raises": 0}
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        totals["python files"] += 1
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                totals["test functions"] += 1
            elif isinstance(node, ast.Assert):
                totals["asserts"] += 1
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "raises":
                totals["pytest.raises"] += 1
    return totals


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "tests"
    for key, value in count(root).items():
        print(f"{key}: {value}")
