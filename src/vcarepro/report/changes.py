"""What changed against the previous commit: the `dvc params diff` / `dvc metrics diff` view.

Read through DVC (which works from inside a running stage): the params and the run
metrics of ``HEAD``, from git and DVC's cache, against the workspace. The metrics of every
run are read in one pass over the repository. A fresh clone whose cache lacks HEAD's
metrics shows params only, and says so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from vcarepro.params.config import flatten

METRIC_KEYS = ("top1", "top5", "fid", "sfid", "kid_mean", "inception_score", "precision", "recall")


def _params_at(rev: str, root: Path) -> Dict[str, Any]:
    import dvc.api

    return dvc.api.params_show(repo=str(root), rev=rev)


def _metrics_at(rev: str, root: Path, targets: List[str]) -> Dict[str, Optional[Dict[str, Any]]]:
    """{target: its metrics at ``rev``, or None where that revision's file is not in DVC's cache}."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:  # one index of the revision for every target (dvc.api reads it per call)
        shown = repo.metrics.show(targets=targets, revs=[rev], on_error="return")
    if "error" in shown.get(rev, {}):
        raise shown[rev]["error"]
    files = shown.get(rev, {}).get("data", {})
    return {target: files.get(target, {}).get("data") for target in targets}


def params_changes(current: Dict[str, Any], previous: Dict[str, Any]) -> List[Dict[str, str]]:
    now, before = flatten(current), flatten(previous)
    return [
        {"param": k, "previous": str(before.get(k, "absent")), "now": str(now.get(k, "absent"))}
        for k in sorted(set(now) | set(before))
        if now.get(k) != before.get(k)
    ]


def metrics_changes(
    current: Dict[str, Dict[str, Any]], previous: Dict[str, Dict[str, Any]], stale: Optional[Dict[str, str]] = None
) -> List[Dict[str, str]]:
    """Per run and headline metric: previous value, now, change (numbers only).

    A run in ``stale`` (run -> the stale text) has no current numbers: "now" says what to re-run.
    """
    stale = stale or {}
    rows = []
    for run in sorted(set(current) | set(previous) | set(stale)):
        for key in METRIC_KEYS:
            a, b = previous.get(run, {}).get(key), current.get(run, {}).get(key)
            if run in stale:
                if a is not None:
                    rows.append({"run": run, "metric": key, "previous": f"{a:.4g}", "now": stale[run], "change": ""})
                continue
            if a is None and b is None:
                continue
            if a == b:
                continue
            change = f"{b - a:+.4g}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) else ""
            rows.append(
                {
                    "run": run,
                    "metric": key,
                    "previous": "absent" if a is None else f"{a:.4g}",
                    "now": "absent" if b is None else f"{b:.4g}",
                    "change": change,
                }
            )
    return rows


def changes_since(
    root: Path,
    params: Dict[str, Any],
    run_metrics: Dict[str, Dict[str, Any]],
    rev: str = "HEAD",
    stale: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """{"rev", "params": rows | None, "metrics": rows | None, "note"} comparing the workspace with ``rev``."""
    out: Dict[str, Any] = {"rev": rev, "params": None, "metrics": None, "note": ""}
    try:
        out["params"] = params_changes(params, _params_at(rev, root))
    except Exception as err:  # no commit yet, not a git repository, unreadable params
        out["note"] = f"params of {rev} are not readable ({type(err).__name__}); no comparison."
        return out
    targets = {name: f"runs/{branch}/{name}/metrics.json" for branch, names in run_metrics.items() for name in names}
    try:
        shown = _metrics_at(rev, root, list(targets.values()))
    except Exception as err:
        out["note"] = f"metrics of {rev} are not readable ({type(err).__name__}); params only."
        return out
    previous = {name: shown[target] for name, target in targets.items() if shown.get(target) is not None}
    missing = sorted(set(targets) - set(previous))
    if targets and not previous:
        out["note"] = (
            f"{rev}'s run metrics are not in this checkout's DVC cache (a fresh clone: `dvc pull`, or "
            f"`dvc repro` at {rev}, brings them); params only."
        )
        return summarise_new(out)
    current = {name: metrics for branch in run_metrics.values() for name, metrics in branch.items() if metrics}
    out["metrics"] = metrics_changes(current, previous, stale)
    if missing:
        out["note"] = (
            f"{len(missing)} run(s) have no metrics at {rev} in this checkout's DVC cache "
            f"(not run then, or not pulled): {', '.join(missing)}."
        )
    return summarise_new(out)


def summarise_new(out: Dict[str, Any]) -> Dict[str, Any]:
    """A table whose every row is "absent -> value" says nothing row by row: one sentence instead."""
    rev = out["rev"]
    params, metrics = out.get("params"), out.get("metrics")
    if params and all(r["previous"] == "absent" for r in params):
        out["params_sentence"] = (
            f"All {len(params)} params that differ are absent at {rev} (new since then); none changed value."
        )
        out["params"] = []
    if metrics and all(r["previous"] == "absent" for r in metrics):
        runs = sorted({r["run"] for r in metrics})
        out["metrics_sentence"] = (
            f"All {len(metrics)} headline metrics that differ, of {len(runs)} runs, are absent "
            f"at {rev} (new since then); none changed value."
        )
        out["metrics"] = []
    return out
