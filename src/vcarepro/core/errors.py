"""Errors a user can fix (bad params, a missing path, corrupt data, a diverged run) and how stages report them.

Every error this project raises on purpose names the problem and the fix in one sentence. Stages
print such an error as that one line, without a traceback, and exit with status 2
(:func:`run_stage`); anything else (a bug, a library failure) keeps its full traceback. Each class
is also a built-in exception, so ``except ValueError`` and the like still catch it.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Callable, Optional

USER_ERROR_STATUS = 2
INTERRUPTED_STATUS = 130  # what a shell gives a command that SIGINT ended: 128 + 2


class UserError(Exception):
    """A problem in the user's input, data, parameters or environment, with its fix in the message."""

    def __str__(self) -> str:
        return worker_sentence(super().__str__())


# torch's DataLoader re-raises a loader worker's exception in the loading process as the same class, built
# from "Caught NAME in DataLoader worker process N.\nOriginal Traceback ...\nmodule.NAME: sentence" (its
# ExceptionWrapper): the sentence is the last part, after the worker's traceback
_RERAISED = re.compile(r"Caught (\w+) [^\n]*\.\nOriginal Traceback \(most recent call last\):\n")


def worker_sentence(text: str) -> str:
    """``text`` itself, or the error's own sentence where ``text`` is a loader worker's re-raised traceback."""
    caught = _RERAISED.match(text)
    if caught is None:
        return text
    last = None
    for last in re.finditer(rf"^(?:[\w.]+\.)?{caught.group(1)}: ", text, re.MULTILINE):
        pass
    return text[last.end() :].strip() if last is not None else text


class BadInput(UserError, ValueError):
    """A value, option, file content or dataset that cannot be used."""


class UnknownArgument(BadInput, TypeError):
    """A keyword argument a model or layer does not take (a TypeError, as Python and timm's factory raise one)."""


class MissingInput(UserError, FileNotFoundError):
    """A path the stage needs does not exist."""


class UnknownName(UserError, KeyError):
    """A run, model or section name that is not defined."""

    def __str__(self) -> str:  # KeyError would quote the sentence
        return worker_sentence(str(self.args[0])) if self.args else ""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(UserError, OSError):
    """No space left (ENOSPC) or the quota exhausted (EDQUOT) where a stage writes."""


def disk_full_error(err: BaseException, path: Optional[str | Path], needed: Optional[int] = None) -> DiskFull:
    """The one sentence for ``err`` (ENOSPC / EDQUOT, or safetensors' wrapping of them) while writing ``path``."""
    quota = getattr(err, "errno", None) == errno.EDQUOT or "quota" in str(err).lower()
    where = Path(path).parent if path is not None else None
    while where is not None and not where.is_dir() and where != where.parent:
        where = where.parent  # df works on what exists: the directory the file was going into
    need = f" ({needed:,} bytes were needed)" if needed else ""
    return DiskFull(
        f"{'the disk quota is exhausted' if quota else 'no space is left on the device'} while writing "
        f"{path if path is not None else 'an output of this stage'}{need}; free space there (`df -h "
        f"{where or '.'}`) or point that directory elsewhere (checkpoints/ and runs/ may be symbolic links to a "
        f"larger disk), then {rerun_advice()}."
    )


COMMAND: Optional[str] = None  # the command line as typed, where a dispatcher (`vcarepro export ...`) knows it


def this_command() -> str:
    """The command line this process runs, as its user would type it again (``python -m MODULE ARGS``)."""
    if COMMAND:
        return COMMAND
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec and spec.name:
        head = f"python -m {spec.name.removesuffix('.__main__')}"
    else:
        head = f"python {shlex.quote(sys.argv[0])}" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])


def rerun_advice() -> str:
    """What to run again after the problem is fixed: a stage's `dvc repro`, else the command itself."""
    if os.environ.get("DVC_STAGE"):
        return "re-run `dvc repro`; DVC records nothing of this stage"
    return f"run `{this_command()}` again"


def is_disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in DISK_FULL:
        return True
    # safetensors raises its own SafetensorError with the OS's message; torch a RuntimeError
    text = str(err)
    return type(err).__name__ in ("SafetensorError", "RuntimeError") and (
        "No space left on device" in text
        or "Disk quota exceeded" in text
        or "os error 28" in text
        or "os error 122" in text
    )


def error_line(err: BaseException) -> Optional[str]:
    """The one ``error:`` line for a user error or a full disk; None for anything else, which keeps its traceback."""
    if isinstance(err, UserError):
        return f"error: {err}"
    if is_disk_full(err):
        return f"error: {disk_full_error(err, _written_path(err))}"
    return None


def refused(err: Exception) -> int:
    """A command's end for ``err``: its one ``error:`` line and exit status 2; anything without one (a bug) raises."""
    line = error_line(err)
    if line is None:
        raise err
    print(line, file=sys.stderr, flush=True)
    return USER_ERROR_STATUS


def interrupted_line(what: Optional[str] = None, resume: Optional[str] = None) -> str:
    """The one line a command prints when Ctrl-C stops it: what stopped and the command that resumes it (under DVC
    the stage, resumed by `dvc repro`, a training stage from its last checkpoint; elsewhere the same command)."""
    stage = os.environ.get("DVC_STAGE")
    if what is None:
        what = f"stage {stage}" if stage else "the command"
    if resume is None:
        if not stage:
            resume = "the same command"
        elif os.environ.get("DVC_EXP_BASELINE_REV"):  # set by DVC in an experiment's run
            resume = "the same `dvc exp run`"
        else:
            resume = "`dvc repro`"
    return f"interrupted: {what} stopped by Ctrl-C; resume with {resume}"


def interruptible() -> None:
    """Ctrl-C raises KeyboardInterrupt here even where SIGINT came in ignored (a job a non-interactive shell put
    in the background ignores it, and Python then never installs its handler), and even where it lands in a
    finalizer; main thread only."""
    try:
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: leave signals alone
        return
    if sys.unraisablehook is not _ctrl_c_again:
        global _unraisable
        _unraisable, sys.unraisablehook = sys.unraisablehook, _ctrl_c_again


_unraisable = sys.unraisablehook


def _ctrl_c_again(unraisable) -> None:
    """Python drops an exception raised in a finalizer (a ``__del__``, a weakref callback, which the garbage
    collector runs between any two lines): a Ctrl-C landing there would be lost and the run go on, so send it again
    from a thread, shortly (sent from here, it would land in this hook, where it is dropped too)."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        import threading

        again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
        again.daemon = True
        again.start()
    else:
        _unraisable(unraisable)


def run_stage(main: Callable[[], object], *, what: Optional[str] = None) -> None:
    """Run ``main``: a :class:`UserError` becomes one line on stderr and exit status 2; Ctrl-C one
    ``interrupted: ...`` line (:func:`interrupted_line`) and exit status 130.

    So does a full disk or an exhausted quota wherever it happens (a library's write included),
    naming the file being written when the error or the writing frame tells it. A DVC stage calls
    :func:`vcarepro.core.stage.run_stage`, which times this one (:mod:`vcarepro.core.stage_clock`).
    """
    interruptible()
    try:
        from vcarepro.core.environment import warn_if_moved
        from vcarepro.core.numerics import NumericsError, enter

        warn_if_moved()  # one line when a package's version differs from what dvc.lock was recorded under

        try:
            enter()  # the numerics profile stages/run.py set: check it took effect, set its in-process parts
        except NumericsError as err:
            raise BadInput(str(err)) from None
        main()
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback; what the stage wrote is not recorded by DVC
        _ending()
        print(interrupted_line(what), file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_STATUS) from None
    except Exception as err:
        line = error_line(err)
        if line is None:
            raise
        _ending()
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(USER_ERROR_STATUS) from None


def _ending() -> None:
    """In a rank of a launch, ignore SIGTERM from here on: the stage is ending with its sentence, and the launcher
    stopping the other ranks (one of which failed because this one left) must not turn its status 2 into a kill."""
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "0", "1"):  # one process: nobody stops it
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        pass


def _written_path(err: BaseException) -> Optional[str]:
    """The file a failed write was writing: the error's own filename, else an open file or path in the failing
    frames."""
    if getattr(err, "filename", None):
        return str(err.filename)
    tb, found = err.__traceback__, None
    while tb is not None:  # innermost last: the frame closest to the write wins
        for value in tb.tb_frame.f_locals.values():
            name, mode = getattr(value, "name", None), getattr(value, "mode", None)
            if hasattr(value, "write") and isinstance(name, str) and isinstance(mode, str) and set(mode) & set("wax+"):
                found = name
        tb = tb.tb_next
    return found
