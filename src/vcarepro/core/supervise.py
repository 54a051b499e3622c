"""Stopping child processes: a signal, a grace period, SIGKILL for what is left, every child reaped.

One supervisor for the four places that stop children and pass on their parent's signals: the local
launcher's ranks, the seed workers, a SLURM job's stage and the warm server's stage.

A target is a :class:`subprocess.Popen`, a :class:`multiprocessing.Process`, an object with
``send_signal`` (a ``psutil.Process``: signalled only, never waited for), or a pid of this process's own
child. With ``group=True`` signals go to the target's process group, and a target has ended only once its
whole group has; a target that has already ended is not signalled again.

Standard library only: ``stages/warm.py`` imports it before anything else of the package loads.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Type

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a parent passes on to its children
POLL_S = 0.2  # seconds between looks at the children


class Stopped(NamedTuple):
    codes: List[
        Optional[int]
    ]  # each target's return code as subprocess gives it (-N: ended by signal N); None: unknown
    killed: bool  # the grace ran out and SIGKILL was sent


def exit_status(code: int) -> int:
    """The exit status a shell gives a child that returned ``code``: 128 + N for one ended by signal N."""
    return 128 - code if code < 0 else code


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _Child:
    """One target: its return code once it has ended (reaped by the look), and signals to it or its group."""

    def __init__(self, target: Any, group: bool, gone: Tuple[Type[BaseException], ...]):
        self.target, self.group, self.gone = target, group, (ProcessLookupError, *gone)
        self.pid = target if isinstance(target, int) else getattr(target, "pid", None)
        self.ended, self.code = False, None

    def poll(self) -> Optional[int]:
        """None while it runs; then its return code (None where it cannot be known)."""
        if not self.ended:
            target = self.target
            if isinstance(target, int):
                try:
                    pid, status = os.waitpid(target, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: ended, its code unknown
                    self.ended = True
                else:
                    if pid:
                        self.ended, self.code = True, os.waitstatus_to_exitcode(status)
            elif hasattr(target, "poll"):  # subprocess.Popen
                self.code = target.poll()
                self.ended = self.code is not None
            elif hasattr(target, "is_alive"):  # multiprocessing.Process
                if not target.is_alive():
                    self.ended, self.code = True, target.exitcode
            else:
                raise TypeError(f"cannot wait for {target!r}: give a Popen, a multiprocessing.Process or a child's pid")
        return self.code if self.ended else None

    def running(self) -> bool:
        """It runs; for a group, any process of the group is left (the leader's own end is reaped first)."""
        self.poll()
        return not self.ended or (self.group and _group_left(self.pid))

    def send(self, signum: int) -> None:
        target = self.target
        try:
            if self.group:
                if isinstance(target, int) or _group_left(self.pid):
                    os.killpg(self.pid, signum)
            elif isinstance(target, int):
                os.kill(target, signum)
            elif hasattr(target, "send_signal"):  # Popen (does nothing once reaped), psutil.Process
                target.send_signal(signum)
            elif self.running():  # multiprocessing.Process
                os.kill(target.pid, signum)
        except self.gone:  # it ended between the look and the signal
            pass


def _group_left(pgid: int) -> bool:
    """A process of group ``pgid`` runs. Zombies do not count: they have ended, and a parent that is gone leaves
    its orphans' reaping to an init that may never do it (Linux: read from /proc; elsewhere a zombie counts)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):  # none, or none this user may signal: nothing to wait for
        return False
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return True
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        except OSError:  # it ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":  # state, ppid, pgrp
            return True
    return False


def _targets(targets: Any) -> list:
    return list(targets) if isinstance(targets, (list, tuple, set)) else [targets]


def send(targets: Any, signum: int, *, group: bool = False, gone: Tuple[Type[BaseException], ...] = ()) -> None:
    """``signum`` to each target (or its process group) still there; ``gone``: what else, besides
    :class:`ProcessLookupError`, means a target has ended (``psutil.NoSuchProcess``)."""
    for target in _targets(targets):
        _Child(target, group, gone).send(signum)


def stop(
    targets: Any,
    grace_s: float,
    *,
    signals: Sequence[int] = (signal.SIGTERM,),
    pending: Optional[Callable[[], Iterable[int]]] = None,
    kill: Any = None,
    reap_s: Optional[float] = None,
    group: bool = False,
    gone: Tuple[Type[BaseException], ...] = (),
    poll_s: float = POLL_S,
) -> Stopped:
    """Stop ``targets``: each of ``signals`` to those running, SIGKILL once ``grace_s`` seconds pass, then reap.

    * ``signals``: sent first, in order (none: the caller signalled already, or something else stops them);
    * ``grace_s``: seconds the targets get to end before SIGKILL (0: at once; ``math.inf``: never);
    * ``pending``: called at every look, returns signals received since (:func:`forwarding`), passed on to
      the targets still running;
    * ``kill``: who gets SIGKILL instead of the targets still running, once the grace ends or the targets
      have all ended, whichever is first: the whole tree under a target, taken before it was signalled;
    * ``reap_s``: seconds to wait for the targets after SIGKILL (None: until they have all ended);
    * ``group``, ``gone``: as for :func:`send`.
    """
    children = [_Child(target, group, gone) for target in _targets(targets)]
    for signum in signals:
        for child in children:
            if child.running():
                child.send(signum)
    since = time.monotonic()
    killed_at = None
    while True:
        running = [child for child in children if child.running()]
        for signum in pending() if pending is not None else ():
            for child in running:
                child.send(signum)
        if not running:
            break
        now = time.monotonic()
        if killed_at is None and now - since > grace_s:
            killed_at = now
            if kill is not None:
                send(kill, signal.SIGKILL, group=group, gone=gone)
            else:
                for child in running:
                    child.send(signal.SIGKILL)
        elif killed_at is not None and reap_s is not None and now - killed_at > reap_s:
            break
        time.sleep(poll_s)
    if kill is not None and killed_at is None:  # the targets ended in time: what is left of the tree goes
        send(kill, signal.SIGKILL, group=group, gone=gone)
    return Stopped([child.code for child in children], killed_at is not None)


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached a tool inside :func:`terminated_raises`: a `timeout`, a scheduler cancelling
    the job, a closed terminal. ``status`` is the shell's 128 + N. A BaseException, as KeyboardInterrupt is, so that
    no ``except Exception`` on the way (a part's own error report, a library's) takes it for a failure and goes on."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.status = 128 + signum

    def line(self, what: str) -> str:
        """The one line the tool ends with."""
        return f"stopped: {what} ended by {self}, with every process it started; run the same command again"


@contextmanager
def terminated_raises() -> Iterator[None]:
    """For the duration, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread (elsewhere they keep their
    action). Their default ends the process at once, its ``finally`` blocks unrun: a child in a session of its own
    (the drift check's ``dvc repro``, the GPU check's torchrun) would then run on, orphaned."""

    def _raise(signum: int) -> None:
        raise Terminated(signum)

    with forwarding(_raise, (signal.SIGTERM, signal.SIGHUP)):
        yield


@contextmanager
def forwarding(to: Callable[[int], Any], signals: Sequence[int] = FORWARDED) -> Iterator[None]:
    """For the duration, each of ``signals`` reaching this process calls ``to(signum)`` instead of its own
    action; the handlers before are restored after. Only the main thread may set handlers: in another one,
    signals are left alone."""
    previous = {}
    for signum in signals:
        try:
            previous[signum] = signal.signal(signum, lambda signum, frame: to(signum))
        except ValueError:  # not the main thread: leave signals alone
            break
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
