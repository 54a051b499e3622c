"""Whose composition of conf/ this is: :mod:`vcarepro.params.config`'s own, or DVC's.

Hydra installs ``hydra_plugins/`` wherever it finds it on ``sys.path``: in DVC's process (what it is for) and in
ours when ``python -m ...`` runs in the checkout's root. :mod:`vcarepro.params.dvc_compose`'s wrap of Hydra's loader
lets through what :func:`own_composition` marks (no DVC wording, no DvcException, no second check). The mark lives
in this module of its own, imported by both: ``python -m vcarepro.params.config`` runs that module as ``__main__``,
a second copy whose own mark the wrap would never see.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List

OWN_COMPOSITION: List[bool] = []  # non-empty inside own_composition()


@contextmanager
def own_composition() -> Iterator[None]:
    """Compositions of conf/ in here are ours: the DVC wrap lets them through."""
    OWN_COMPOSITION.append(True)
    try:
        yield
    finally:
        OWN_COMPOSITION.pop()
