"""How far a long loop has got: a tqdm bar on a terminal, a line every ``progress.interval_s`` seconds in a log.

Every loop that can run for hours reports through one :class:`Progress`; ``python -m vcarepro.tools.cluster
status`` reads the latest log line of each running job (:func:`latest`). ``figures`` (the loss, the learning
rate...) is called only when a line is due, so a loss on a GPU is synced only then. Only a process a stage
has :func:`configure`\\ d reports, and of a launch's ranks only rank 0. No stage declares ``interval_s`` and
nothing printed here reaches an output, so changing it re-runs nothing.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, TextIO

DEFAULT_INTERVAL_S = 60.0
BAR_REFRESH_S = 0.5  # how often a terminal bar takes a new position and figures


@dataclass
class _Settings:
    context: Optional[str] = None  # "train_cls deit_tiny-vca": what every label starts with; None: not configured
    interval_s: float = DEFAULT_INTERVAL_S
    bar: Optional[bool] = None  # None: a bar where stderr is a terminal


_settings = _Settings()


def configure(
    params: Optional[Mapping[str, Any]] = None,
    stage: str = "",
    run: Optional[str] = None,
    *,
    interval_s: Optional[float] = None,
) -> None:
    """Let this process report, its labels starting with ``stage`` and ``run``, at params' ``progress.interval_s``."""
    section = (params or {}).get("progress") or {}
    interval = interval_s if interval_s is not None else section.get("interval_s", DEFAULT_INTERVAL_S)
    _settings.context = " ".join(part for part in (stage, run) if part) or "progress"
    _settings.interval_s = float(interval)
    _settings.bar = None


def lines_only() -> None:
    """Report in lines even on a terminal: a forked seed worker, whose bar would fight its siblings' for the line."""
    _settings.bar = False


def reset() -> None:
    """Back to the silence of an unconfigured process (tests)."""
    global _settings
    _settings = _Settings()


def _main_rank() -> bool:
    return os.environ.get("RANK", "0") in ("", "0")


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "ch", "sh", "x")) else "s")


def duration(seconds: float) -> str:
    """``0:04:05`` below a day, ``1d 03:00:00`` from one."""
    whole = int(round(max(seconds, 0.0)))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}d {hours:02d}:{minutes:02d}:{secs:02d}" if days else f"{hours}:{minutes:02d}:{secs:02d}"


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _figure(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class Progress:
    """One loop's progress: ``update(position)`` as it goes, ``note(text)`` for a line now, ``close()`` at the end.

    ``total`` None: a count without percentage or ETA. ``start``: where a resumed loop begins (its ETA counts
    only the work done in this process). ``images_per_step``: images an update of one ``unit`` stands for (a
    training step's global batch), for an images/s figure. ``figures``: a callable giving ``{name: value}``
    for the line (called only when one is due). ``enabled`` None: a configured process's rank 0.
    """

    def __init__(
        self,
        what: Optional[str],
        total: Optional[int],
        *,
        start: int = 0,
        unit: str = "step",
        images_per_step: Optional[int] = None,
        seed: Optional[int] = None,
        figures: Optional[Callable[[], Mapping[str, Any]]] = None,
        enabled: Optional[bool] = None,
        interval_s: Optional[float] = None,
        bar: Optional[bool] = None,
        clock: Callable[[], float] = time.monotonic,
        stream: Optional[TextIO] = None,
    ):
        configured = _settings.context is not None
        self.enabled = (configured and _main_rank()) if enabled is None else (enabled and configured)
        parts = [_settings.context if configured else None, f"seed {seed}" if seed is not None else None, what]
        self.label = " ".join(p for p in parts if p) or "progress"
        self.total, self.unit, self.images_per_step = total, unit, images_per_step
        self.figures = figures
        self.interval_s = _settings.interval_s if interval_s is None else float(interval_s)
        self.n = self._start = start
        self._clock, self._stream = clock, stream
        self._bar = None
        self._closed = False
        self._t0 = self._t_last = clock()
        self._n_last = start
        self._due = math.inf  # disabled: never due
        if not self.enabled or (total is not None and start >= total):  # nothing to do: nothing to say
            self.enabled = False
            return
        use_bar = bar if bar is not None else _settings.bar
        if use_bar is None:
            use_bar = stream is None and is_terminal(sys.stderr)
        if use_bar:
            self._bar = _make_bar(self.label, total, start, unit)
            self._due = self._t0 + BAR_REFRESH_S
            return
        self._due = self._t0 + self.interval_s
        self._write(
            self._head()
            + " | start"
            + (", resuming" if start else "")
            + (f", {images_per_step} images a {unit}" if images_per_step else "")
        )

    # -- the loop's side: as cheap as one comparison ------------------------------------------------------------
    def update(self, n: int) -> None:
        """The loop has reached ``n`` (of ``total``)."""
        self.n = n
        if self._clock() >= self._due:
            self._report()

    def advance(self, count: int = 1) -> None:
        self.update(self.n + count)

    def note(self, text: str) -> None:
        """A line now (a validation result), under this loop's label; through the bar on a terminal."""
        if not self.enabled:
            return
        line = f"{self.label} | {text}"
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            self._write(line)

    def close(self, stopped: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._bar is not None:
            self._refresh_bar()
            self._bar.close()
            return
        now = self._clock()
        word = "stopped after" if stopped else "done in"
        parts = [self._head(), f"{word} {duration(now - self._t0)}"]
        if self.n > self._start and now > self._t0:
            parts.append(self._rate((self.n - self._start) / (now - self._t0)))
            parts += self._figures()
        self._write(" | ".join(parts))

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            # Ctrl-C: no closing line; the command's one `interrupted: ...` line says it (core.errors.run_stage)
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            return
        self.close(stopped=kind is not None)

    # -- a report ------------------------------------------------------------------------------------------------
    def _report(self) -> None:
        if self._bar is not None:
            self._refresh_bar()
            self._due = self._clock() + BAR_REFRESH_S
            return
        now = self._clock()
        parts = [self._head(), *self._figures()]
        if now > self._t_last:
            parts.append(self._rate((self.n - self._n_last) / (now - self._t_last)))
        parts.append(f"elapsed {duration(now - self._t0)}")
        if self.total is not None:
            done = self.n - self._start
            parts.append(f"eta {duration((self.total - self.n) * (now - self._t0) / done)}" if done > 0 else "eta ?")
        self._write(" | ".join(parts))
        self._t_last, self._n_last = now, self.n
        self._due = now + self.interval_s

    def _refresh_bar(self) -> None:
        bar = self._bar
        shown = self._figures()
        now = self._clock()
        if self.images_per_step and now > self._t0 and self.n > self._start:
            shown.append(f"{_number((self.n - self._start) * self.images_per_step / (now - self._t0))} img/s")
        bar.set_postfix_str(", ".join(shown), refresh=False)
        bar.update(self.n - bar.n)

    def _head(self) -> str:
        if self.total is None:
            return f"{self.label} | {self.unit} {self.n}"
        percent = 100.0 * self.n / self.total if self.total else 100.0
        return f"{self.label} | {self.unit} {self.n}/{self.total} ({percent:.1f}%)"

    def _rate(self, per_second: float) -> str:
        if self.images_per_step:
            return f"{_number(per_second * self.images_per_step)} img/s"
        if self.unit in ("image", "sample"):
            return f"{_number(per_second)} img/s"
        return f"{_number(per_second)} {_plural(self.unit)}/s"

    def _figures(self) -> List[str]:
        if self.figures is None:
            return []
        try:
            values = self.figures()
        except Exception as err:  # noqa: BLE001 - a progress line never stops the work it reports on
            return [f"figures unavailable ({type(err).__name__})"]
        return [f"{name} {_figure(value)}" for name, value in values.items() if value is not None]

    def _write(self, line: str) -> None:
        stream = self._stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (where a bar is drawn); a closed or replaced stream is not."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _make_bar(label: str, total: Optional[int], start: int, unit: str):
    from tqdm import tqdm

    class Bar(tqdm):
        # no monitor thread: forking a loader worker or a seed worker from a process with threads is best avoided
        monitor_interval = 0

    return Bar(
        total=total,
        initial=start,
        desc=label,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=BAR_REFRESH_S,
        smoothing=0.1,
        leave=True,
    )


# -- reading it back (python -m vcarepro.tools.cluster status) ---------------------------------------------------------

_LINE = re.compile(
    r"^(?P<label>[^|]+?) \| (?P<unit>[a-z]+) (?P<n>\d+)(?:/(?P<total>\d+) \((?P<percent>[\d.]+)%\))?"
    r" \| (?P<rest>.*)$"
)
_ETA = re.compile(r"(?:^| \| )eta (?P<eta>[^|]+?)\s*(?: \||$)")


@dataclass(frozen=True)
class Line:
    """One progress line read back: its label, position, and the ETA it gave (None at start and end)."""

    label: str
    unit: str
    n: int
    total: Optional[int]
    eta: Optional[str]
    state: str  # start, running, done or stopped

    def summary(self) -> str:
        if self.total is None:
            where = f"{self.unit} {self.n}"
        else:
            where = f"{self.unit} {self.n}/{self.total} ({100.0 * self.n / self.total if self.total else 100.0:.1f}%)"
        if self.state == "running":
            return f"{where}, eta {self.eta}" if self.eta else where
        return f"{where}, {self.state}"


def parse_line(text: str) -> Optional[Line]:
    """The :class:`Line` that ``text`` is, or None for any other line of a log."""
    found = _LINE.match(text.strip())
    if found is None:
        return None
    rest = found["rest"]
    if rest.startswith("start"):
        state = "start"
    elif rest.startswith("done in"):
        state = "done"
    elif rest.startswith("stopped after"):
        state = "stopped"
    elif "elapsed " in rest:
        state = "running"
    else:
        return None
    eta = _ETA.search(rest)
    return Line(
        found["label"],
        found["unit"],
        int(found["n"]),
        int(found["total"]) if found["total"] else None,
        eta["eta"] if eta and state == "running" else None,
        state,
    )


def latest(lines: Iterable[str]) -> List[Line]:
    """What a log says now: the latest line of each loop still going (seeds side by side), in the order they
    last reported; the very last line when every loop has ended."""
    last: Dict[str, Line] = {}
    for text in lines:
        line = parse_line(text)
        if line is not None:
            last.pop(line.label, None)
            last[line.label] = line
    going = [line for line in last.values() if line.state in ("start", "running")]
    return going or list(last.values())[-1:]
