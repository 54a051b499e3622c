"""The check's parts, run one after another, each in its own thread under its share of the budget.

A part is ``run(check, outcome)``: it appends rows (``id``, ``status``, one-line ``reason``) to ``outcome.rows``
and checks ``check.out_of_time(...)`` before each unit of work. An exception or a hung thread (abandoned
``grace`` seconds past its deadline) fails that part only; what a part leaves of its share goes to the next.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

PASS, FAIL, TIMEOUT, SKIPPED = "pass", "fail", "timeout", "skipped"
WHERE_WHEELS = "docs/performance.md, GPU check"

THREAD_PREFIX = "gpu-check-"  # each part runs in a thread of this name and its own


def abandoned() -> List[threading.Thread]:
    """The parts' threads still running after the command gave up on them, or after Ctrl-C stopped its wait."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def one_line(err: BaseException) -> str:
    """An exception as one line: a missing package names the fix, anything else its type and first line."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        return (
            f"{err.name.split('.')[0]} is not installed here; carry its wheel to this machine and install it "
            f"({WHERE_WHEELS})"
        )
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()[:300]


@dataclass
class Check:
    """What every part reads: where it runs, at which sizes, and the clock it must keep to."""

    device: Any  # torch.device
    tiny: bool
    compile: bool = True
    profile: bool = False
    out: Any = None  # the output folder (pathlib.Path)
    options: Dict[str, Any] = field(default_factory=dict)  # the command's other options, by name
    log: Callable[[str], None] = lambda line: None
    deadline: float = float("inf")  # time.monotonic() by which the running part must stop
    clock: Callable[[], float] = time.monotonic

    def left(self) -> float:
        return self.deadline - self.clock()

    def out_of_time(self, outcome: "Outcome", done: int, total: int, what: str) -> bool:
        """True (and the outcome says how far it got) once the running part's deadline has passed."""
        if self.left() > 0:
            return False
        outcome.out_of_time = True
        outcome.summary = f"ran out of its {outcome.share_s:.0f} s share after {done} of {total} {what}"
        return True


@dataclass
class Outcome:
    part: str
    title: str
    share_s: float = 0.0
    rows: List[Dict[str, Any]] = field(default_factory=list)
    data: Dict[str, Any] = field(default_factory=dict)  # what is not a row (a ratio, a note, a file written)
    summary: str = ""  # the part's own one line when it passes
    skipped: Optional[str] = None  # why the part did not run
    out_of_time: bool = False
    error: Optional[str] = None
    status: str = "running"
    reason: str = ""
    seconds: float = 0.0

    def settle(self) -> None:
        """The status and one-line reason from what the part left."""
        failed = [r for r in self.rows if r.get("status") == FAIL]
        if self.error:
            self.status, self.reason = FAIL, self.error
        elif self.skipped:
            self.status, self.reason = SKIPPED, self.skipped
        elif failed:
            first = failed[0]
            self.status = FAIL
            self.reason = f"{len(failed)} of {len(self.rows)} rows failed; first: {first['id']}: {first.get('reason')}"
        elif self.out_of_time:
            self.status, self.reason = TIMEOUT, self.summary
        else:
            self.status, self.reason = PASS, self.summary or f"{len(self.rows)} rows"

    def as_dict(self) -> Dict[str, Any]:
        return {
            "part": self.part,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "share_s": round(self.share_s, 1),
            "rows": [dict(r) for r in list(self.rows)],
            "data": dict(self.data),
        }


@dataclass
class Part:
    name: str
    title: str
    share: float  # of the budget, relative to the other parts chosen
    run: Callable[[Check, Outcome], None]


def _run_one(part: Part, check: Check, outcome: Outcome) -> None:
    try:
        part.run(check, outcome)
    except BaseException as err:  # noqa: BLE001 - any failure is this part's one line; the others still run
        outcome.error = one_line(err)
        check.log(f"{part.name}: failed: {outcome.error}\n{traceback.format_exc()}")


def run_parts(parts: Sequence[Part], check: Check, budget_s: float, *, grace_s: float = 30.0) -> List[Dict[str, Any]]:
    """Every part in turn, the k-th by ``start + budget_s x (its share and those before it)``; their outcomes."""
    total = sum(p.share for p in parts) or 1.0
    start = check.clock()
    results, cumulative = [], 0.0
    for part in parts:
        cumulative += part.share
        deadline = start + budget_s * cumulative / total
        outcome = Outcome(part.name, part.title, share_s=max(deadline - check.clock(), 0.0))
        check.deadline = deadline
        # What lives between parts (torch, timm, the composed params) is frozen out of the garbage collector: the
        # preflight frees memory with gc.collect() around every run it steps, which would otherwise walk that whole
        # heap each time (half a second a call on a 2-core CPU, most of a tiny check's time).
        gc.collect()
        gc.freeze()
        check.log(f"{part.name}: {part.title} ({outcome.share_s:.0f} s)")
        began = check.clock()
        thread = threading.Thread(target=_run_one, args=(part, check, outcome), name=f"{THREAD_PREFIX}{part.name}")
        thread.daemon = True
        thread.start()
        thread.join(max(deadline - check.clock(), 0.0) + grace_s)
        outcome.seconds = check.clock() - began
        if thread.is_alive():
            outcome.settle()
            snapshot = outcome.as_dict()
            snapshot["status"] = TIMEOUT
            snapshot["reason"] = (
                f"still running {grace_s:.0f} s after its {outcome.share_s:.0f} s share ended; abandoned with "
                f"{len(snapshot['rows'])} rows (a hung kernel or collective?)"
            )
            results.append(snapshot)
        else:
            outcome.settle()
            results.append(outcome.as_dict())
        check.log(f"{part.name}: {results[-1]['status']}: {results[-1]['reason']}")
    gc.unfreeze()  # a caller that goes on (a test) gets its collector back whole
    return results
