"""Where a `dvc repro` spends its wall time: one record per stage in timings/stages/, a table at the end.

stages/run.py notes when the stage started and under which DVC process (``VCAREPRO_STAGE_STARTED``);
:func:`vcarepro.core.stage.run_stage` writes ``timings/stages/<stage>.json`` (start-up, work, DVC process)
when it ends, and the report stage prints the table of its DVC process's stages to ``timings/stages.md``.
The DVC process's start time only tells runs apart (a shell may have exec'd it). Nothing here is a DVC
output or dependency, and only a stage under DVC (``DVC_STAGE`` set) records anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional

STARTED = "VCAREPRO_STAGE_STARTED"  # run.py's start (seconds since the epoch) and DVC process, as JSON
RECORDS = Path("timings") / "stages"
TABLE = Path("timings") / "stages.md"


def note_start(started: float, environ=os.environ) -> None:
    """In stages/run.py: the stage's clock started at ``started`` (taken before run.py imported anything), under
    the DVC process that is run.py's nearest ancestor named dvc (the stage itself may be a child of the warm
    server, whose ancestors are not DVC's)."""
    dvc = dvc_process()
    environ[STARTED] = json.dumps(
        {"started": started, **({"dvc_pid": dvc["pid"], "dvc_started": dvc["started"]} if dvc else {})}
    )


def take_start(environ=os.environ) -> Optional[dict]:
    """The start run.py noted (``started``, ``dvc_pid``, ``dvc_started``), taken out of the environment so that
    the stage's seed workers and the launcher's other ranks do not record the stage again; None outside DVC or
    without run.py."""
    noted = environ.pop(STARTED, None)
    if noted is None or not environ.get("DVC_STAGE") or environ.get("RANK", "0") not in ("", "0"):
        return None
    try:
        start = json.loads(noted)
        return {
            "started": float(start["started"]),
            "dvc_pid": start.get("dvc_pid"),
            "dvc_started": start.get("dvc_started"),
        }
    except (ValueError, TypeError, KeyError):
        return None


def dvc_process(pid: Optional[int] = None) -> Optional[Dict[str, float]]:
    """The nearest ancestor of ``pid`` (this process) that runs DVC: its pid and start time, or None."""
    import psutil

    try:
        for parent in psutil.Process(os.getpid() if pid is None else pid).parents():
            if any(os.path.basename(arg) == "dvc" for arg in parent.cmdline()[:3]):
                return {"pid": parent.pid, "started": parent.create_time()}
    except psutil.Error:
        return None
    return None


def record(root: Path, stage: str, start: dict, main_started: float, ended: float, status: str) -> Path:
    """Write ``timings/stages/<stage>.json`` under ``root``; ``start`` is :func:`take_start`'s. Written whole or
    not at all, by :mod:`vcarepro.core.io` (a full disk leaves the previous record and no temporary file)."""
    started = start["started"]
    path = root / RECORDS / f"{stage}.json"
    from vcarepro.core.io import write_json  # torch-free; imported when a stage ends, not by stages/run.py

    write_json(
        path,
        {
            "stage": stage,
            "started": round(started, 3),
            "start_up_s": round(main_started - started, 3),
            "work_s": round(ended - main_started, 3),
            "wall_s": round(ended - started, 3),
            "ended": round(ended, 3),
            "status": status,
            "dvc_pid": start.get("dvc_pid"),
            "dvc_started": None if start.get("dvc_started") is None else round(start["dvc_started"], 3),
        },
    )
    return path


def this_repro(root: Path, stage: str) -> List[dict]:
    """The records of every stage that ran under the same DVC process as ``stage``'s record, in order."""
    own = _read(root / RECORDS / f"{stage}.json")
    if own is None:
        return []
    rows = [_read(path) for path in sorted((root / RECORDS).glob("*.json"))]
    run = (own["dvc_pid"], own["dvc_started"])
    same = [row for row in rows if row and (row.get("dvc_pid"), row.get("dvc_started")) == run]
    return sorted(same, key=lambda row: row["started"])


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def table(rows: List[dict]) -> str:
    """The Markdown table of ``rows`` (one DVC run's stages): each stage longest first, their sum, and DVC's own
    time between them (from one stage's end to the next one's start: hashing, dvc.lock, the next stage's checks)."""
    rows = sorted(rows, key=lambda row: row["started"])
    lines = [
        "| stage | wall s | start-up s | work s | status |",
        "|---|---:|---:|---:|---|",
    ]
    for row in sorted(rows, key=lambda row: -row["wall_s"]):
        times = f"{row['wall_s']:.1f} | {row['start_up_s']:.1f} | {row['work_s']:.1f}"
        lines.append(f"| {row['stage']} | {times} | {row['status']} |")
    wall = sum(row["wall_s"] for row in rows)
    start_up = sum(row["start_up_s"] for row in rows)
    work = sum(row["work_s"] for row in rows)
    between = sum(max(0.0, later["started"] - earlier["ended"]) for earlier, later in zip(rows, rows[1:]))
    span = rows[-1]["ended"] - rows[0]["started"] if rows else 0.0
    lines.append(f"| all {len(rows)} stages | {wall:.1f} | {start_up:.1f} | {work:.1f} | |")
    lines.append(f"| DVC between the stages | {between:.1f} | | | |")
    lines.append(f"| first stage's start to last one's end | {span:.1f} | | | |")
    head = (
        f"Wall time of the {len(rows)} stages this DVC run ran, longest first. Start-up: stages/run.py to the "
        "stage's main (warm fork or imports, launcher); work: main itself. DVC between the stages: hashing "
        "outputs and dependencies, rewriting dvc.lock, checking the next stage."
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def write_table(root: Path, stage: str) -> Optional[str]:
    """The table of ``stage``'s DVC run, written to ``timings/stages.md`` under ``root``; None without records."""
    rows = this_repro(root, stage)
    if not rows:
        return None
    from vcarepro.core.io import write_text

    text = table(rows)
    write_text(root / TABLE, text)
    return text
