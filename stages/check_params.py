"""DVC stage `check_params`: the whole of params.yaml checked whenever any of it changes, before any other stage.

Every stage checks params.yaml when it runs, but an edit no stage reads (a misspelt section or key) would run no
stage. This one depends on the whole file, and every other stage on its output, so any `dvc repro` or `dvc exp
run` after an edit refuses a typo in one sentence first. The output holds the same line whenever the check passes:
a correct edit re-runs only the stages whose parameters it changed.
"""

from __future__ import annotations

import argparse

from vcarepro.core.io import write_text
from vcarepro.core.stage import run_stage
from vcarepro.params.config import stage_params

PASSED = "params.yaml: every section and key known, every value within its rule\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", default="data/params.checked")
    args = parser.parse_args()
    stage_params(args.params)
    write_text(args.out, PASSED)
    print(PASSED, end="", flush=True)


if __name__ == "__main__":
    run_stage(main)
