"""Errors a user can fix (bad params, a missing path, corrupt data, a diverged run) and how stages report them.

Every error this project raises on purpose names the problem and the fix in one sentence. Stages
print such an error as that one line, without a traceback, and exit with status 2
(:func:`run_stage`); anything else (a bug, a library failure) keeps its full traceback. Each class
is also the built-in exception it used to be, so ``except ValueError`` and the like still catch it.
"""
from __future__ import annotations

import sys
from typing import Callable

USER_ERROR_STATUS = 2


class UserError(Exception):
    """A problem in the user's input, data, parameters or environment, with its fix in the message."""


class BadInput(UserError, ValueError):
    """A value, option, file content or dataset that cannot be used."""


class MissingInput(UserError, FileNotFoundError):
    """A path the stage needs does not exist."""


class UnknownName(UserError, KeyError):
    """A run, model or section name that is not defined."""

    def __str__(self) -> str:  # KeyError would quote the sentence
        return str(self.args[0]) if self.args else ""


def run_stage(main: Callable[[], object]) -> None:
    """Run a stage's ``main``: a :class:`UserError` becomes one line on stderr and exit status 2."""
    try:
        main()
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(USER_ERROR_STATUS) from None
