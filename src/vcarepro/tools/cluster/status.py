"""The ``status`` command: every stage's state from DVC, SLURM and the books, a running one's progress read from its
log, and what the default remote lacks yet."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import networkx as nx

from vcarepro.core.progress import latest
from vcarepro.tools import remote
from vcarepro.tools.cluster.slurm import ACTIVE, QUEUED, Record, job_paths, load_records, our_jobs
from vcarepro.tools.cluster.stages import out_of_date, stage_graph, todo_stages, topological

PROGRESS_TAIL_BYTES = 1 << 18  # the end of a log that holds its latest progress lines (vcarepro.core.progress)


def progress_log(root: Path, record: Record) -> Path:
    """Where a stage's progress lines go: a job's stdout (submitit's ``_log.out``), a local stage's one log."""
    return job_paths(root, record.job_id).stdout if record.job_id else root / record.log


def log_progress(path: Path, stage: str = "") -> str:
    """How far the loops in a log have got, from their latest progress lines: ``step 1200/375000 (0.3%), eta
    3d 04:12:00`` (several, ``;``-separated, where seeds train side by side); "" for none."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - PROGRESS_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    named = " ".join(stage.split("@"))  # the label's stage and run: the row names them already
    shown = []
    for line in latest(text.splitlines()):
        label = line.label[len(named) :].strip() if named and line.label.startswith(named) else line.label
        shown.append(f"{label}: {line.summary()}" if label else line.summary())
    return "; ".join(shown)


def status_rows(root: Path) -> List[Dict[str, Any]]:
    """Every stage: its state (done / queued / running / failed / ready / waiting), job id, log, note, a
    running one's progress, and a failed one's last log lines."""
    graph = stage_graph(root)
    records = load_records(root)
    listed = our_jobs(root)
    busy = {
        s
        for s, r in records.items()
        if r.state == "submitted" and (not r.job_id or (r.job_id in listed and listed[r.job_id].state in ACTIVE))
    }
    changed = out_of_date(root, graph, busy)
    todo = todo_stages(graph, changed)
    rows = []
    for stage in topological(graph):
        record = records.get(stage)
        job = listed.get(record.job_id) if record is not None and record.job_id else None
        row = {
            "stage": stage,
            "job": record.job_id if record else "",
            "log": record.log if record else "",
            "note": "",
            "tail": [],
            "progress": "",
        }
        if job is not None and job.state in ACTIVE:
            row["state"] = "queued" if job.state in QUEUED else "running"
            row["note"] = job.reason if job.reason not in ("None", "") else ""
        elif record is not None and record.state == "submitted" and not record.job_id:
            row["state"] = "running" if stage in todo else "done"
        elif stage not in todo:
            row["state"] = "done"
        elif record is not None and record.state == "failed":
            row["state"] = "failed"
            row["note"] = " / ".join(record.message[:1] + ([record.fix] if record.fix else []))
            row["tail"] = record.message[1:]
        elif nx.descendants(graph, stage) & todo:
            row["state"] = "waiting"
        else:
            row["state"] = "ready"
        if row["state"] == "running":  # how far it has got: its log's latest progress lines
            row["progress"] = log_progress(progress_log(root, record), stage)
        rows.append(row)
    return rows


def print_status(root: Path, out=sys.stdout) -> None:
    rows = status_rows(root)
    for line in status_lines(rows):
        print(line, file=out)
    for r in rows:
        if r["state"] == "failed":
            print(f"\n{r['stage']} (job {r['job'] or 'here'}) failed; last lines of {r['log']}:", file=out)
            for line in r["tail"]:
                print(f"    | {line}", file=out)
    counts = {
        s: sum(1 for r in rows if r["state"] == s) for s in ("done", "queued", "running", "failed", "ready", "waiting")
    }
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()), file=out)
    print(backup_line(root), file=out)


def backup_line(root: Path) -> str:
    """What the default remote lacks of the workspace's cache, in one line (or that there is no remote)."""
    name = remote.default_remote(root)
    if not name:
        return "no default DVC remote: nothing is backed up (`dvc remote add -d NAME URL`; docs/lab.md)"
    missing, trouble = remote.not_pushed(root)
    if trouble:
        return f"could not read remote '{name}': {trouble}"
    if not missing:
        return f"every output in the cache is on remote '{name}'"
    shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return f"not on remote '{name}' yet: {len(missing)} output(s), {shown}; `dvc push` sends them"


def status_lines(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The table of ``status``: stage, state, job, how far a running one has got (a column only while one
    reports: :func:`log_progress`), log; a row's note below it."""
    width = max(len(r["stage"]) for r in rows)
    shown = max((len(r.get("progress") or "") for r in rows), default=0)
    column = (lambda text: f"{text:<{max(shown, len('progress'))}} ") if shown else (lambda text: "")
    lines = [f"{'stage':<{width}}  {'state':<8} {'job':<8} {column('progress')}log"]
    for r in rows:
        lines.append(
            f"{r['stage']:<{width}}  {r['state']:<8} {r['job']:<8} {column(r.get('progress') or '')}{r['log']}"
        )
        if r["note"]:
            lines.append(f"{'':<{width}}  {r['note']}")
    return lines
