"""The report stage's DVC metrics: one flat file per branch with each run's headline number.

``dvc exp show`` makes a column of every key of every metrics file, so only these two are declared
(docs/pipeline.md says what each holds and how runs are keyed); a run without a current result has no key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional

from vcarepro.core.io import write_json

HEADLINE = {"cls": ("metrics/cls_top1.json", "top1"), "gen": ("metrics/gen_fid.json", "fid")}


def shared_prefix(names: Iterable[str]) -> str:
    """The leading ``-``-separated words every name shares, each name keeping at least its last word."""
    split = [name.split("-") for name in names]
    if not split:
        return ""
    shared = []
    for words in zip(*(w[:-1] for w in split)):
        if len(set(words)) != 1:
            break
        shared.append(words[0])
    return "".join(f"{word}-" for word in shared)


def headline(
    runs: Iterable[str], metrics: Mapping[str, Optional[Mapping]], key: str, shorten: bool = True
) -> Dict[str, float]:
    """{short run name: metrics[run][key]} for every run of ``runs`` that has a current value."""
    runs = list(runs)
    prefix = shared_prefix(runs) if shorten else ""
    return {
        run.removeprefix(prefix): float(metrics[run][key])
        for run in runs
        if (metrics.get(run) or {}).get(key) is not None
    }


def headline_files(params: Mapping, run_metrics: Mapping[str, Mapping[str, Optional[Mapping]]]) -> Dict[str, Dict]:
    """{path under the project: its payload} for both branches. Where the shortened names of the two branches
    would meet (``mhsa`` of a DeiT-T and of a DiT-S/2), both keep their full names: no column is then prefixed
    with its file, so every headline column is a run's name and nothing else (README: Comparing runs)."""
    short = {
        branch: headline(params[f"{branch}_runs"], run_metrics[branch], key) for branch, (_, key) in HEADLINE.items()
    }
    if set(short["cls"]) & set(short["gen"]):
        short = {
            branch: headline(params[f"{branch}_runs"], run_metrics[branch], key, shorten=False)
            for branch, (_, key) in HEADLINE.items()
        }
    return {path: short[branch] for branch, (path, _) in HEADLINE.items()}


def write_headlines(root: str | Path, files: Mapping[str, Mapping]) -> None:
    """Write :func:`headline_files` under ``root`` (keys sorted, the order of DVC's columns)."""
    for path, payload in files.items():
        write_json(Path(root) / path, payload)
