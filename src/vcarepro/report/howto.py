"""How to run a run the report shows without a number: the scale whose run list holds it, and that scale's command.

Every scale's run list is composed from ``conf/`` (``scale=<s>``, with and without ``family=all``); a paper row
whose run is not in this scale's list is run by a scale that has it, switched to as docs/scales.md
does: the embedded default with ``python -m vcarepro.params.config``, the smoke scale as a ``dvc exp run --temp``
experiment, the proxy and paper scales on a git branch of their own. The attention family is ``family=all``.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from vcarepro.params.config import compose

SCALES = ("embedded", "smoke", "proxy", "paper")
# ImageNet's path, which the proxy and paper scales read (docs/paper-scale.md, "Pointing it at ImageNet")
IMAGENET = "prepare_cls.imagenet_root=/path/to/imagenet"
# What runs the runs of this scale's list whose results are not there yet
REPRO = "dvc repro"

# scale -> {family switched on: the params that scale composes}
Matrices = Dict[str, Dict[bool, Dict[str, Any]]]

_CACHE: Dict[str, Matrices] = {}


def _fingerprint(config_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in config_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(config_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def scale_matrices(config_dir: str | Path) -> Matrices:
    """Each scale's params as ``conf/`` composes them, without and with the attention family.

    Composed once per content of ``config_dir`` (the report renders in tests many times over the same
    ``conf/``); a scale that does not compose is left out. The caller gets its own copy.
    """
    config_dir = Path(config_dir)
    key = _fingerprint(config_dir)
    if key not in _CACHE:
        out: Matrices = {}
        for scale in SCALES:
            try:
                out[scale] = {
                    family: compose([f"scale={scale}", f"family={'all' if family else 'none'}"], config_dir=config_dir)
                    for family in (False, True)
                }
            except Exception:  # noqa: BLE001  (a scale this conf/ cannot compose has no runs to offer)
                continue
        _CACHE[key] = out
    return copy.deepcopy(_CACHE[key])


def scale_command(scale: str, family: bool, here: str) -> str:
    """The command that runs ``scale``'s run list (with the attention family where ``family``), from a report
    rendered at scale ``here`` (docs/scales.md; docs/family.md)."""
    if scale == "embedded":
        if here == "embedded":
            return "dvc exp run --temp -S family=all -n family" if family else REPRO
        return f"python -m vcarepro.params.config{' family=all' if family else ''} && dvc repro"
    if scale == "smoke":
        return (
            "dvc exp run --temp -S scale=smoke -S family=all -n smoke-family"
            if family
            else "dvc exp run --temp -S scale=smoke -n smoke"
        )
    # proxy and paper: days of runs, on a git branch of their own whose params and lock it commits
    config = f"python -m vcarepro.params.config scale={scale}{' family=all' if family else ''} {IMAGENET} && dvc repro"
    return config if here == scale else f"git switch -c {scale} && {config}"


class HowToRun:
    """Where each run is in a scale's run list, and the one command (or the fewest) that runs a row's runs.

    ``holds(run)`` maps each scale whose run list answers ``run`` to whether it needs the attention family
    switched on: a classification run is answered as the tables read it (``answering``: the run itself, or the
    run that trains exactly it there, ``rows.answering_run``), a generation run by its name. This scale's own
    list is ``params``' as it is.
    """

    def __init__(
        self,
        params: Mapping[str, Any],
        matrices: Matrices,
        answering: Callable[[str, Mapping[str, Any]], Optional[str]],
    ) -> None:
        self.params, self.scale = params, params["scale"]
        self.matrices = matrices
        self.answering = answering
        m = matrices.get(self.scale, {})
        family_runs = (
            {r for b in ("cls_runs", "gen_runs") for r in set(m[True][b]) - set(m[False][b])}
            if True in m and False in m
            else set()
        )
        self.family_on = any(r in {**params.get("cls_runs", {}), **params.get("gen_runs", {})} for r in family_runs)

    def _in(self, run: str, params: Optional[Mapping[str, Any]]) -> bool:
        if not params:
            return False
        return run in (params.get("gen_runs") or {}) or self.answering(run, params) is not None

    def holds(self, run: str) -> Dict[str, bool]:
        """scale -> whether it needs the attention family switched on, for every scale whose runs answer ``run``."""
        out: Dict[str, bool] = {}
        if self._in(run, self.params):
            out[self.scale] = False
        elif not self.family_on and self._in(run, self.matrices.get(self.scale, {}).get(True)):
            out[self.scale] = True
        for scale in SCALES:
            if scale == self.scale:
                continue
            for family in (False, True):
                if self._in(run, self.matrices.get(scale, {}).get(family)):
                    out[scale] = family
                    break
        return out

    def options(self, holds: Mapping[str, bool]) -> List[Dict[str, Optional[str]]]:
        """The commands of the scales in ``holds``: this scale's alone where it is one of them."""
        if self.scale in holds:
            family = holds[self.scale]
            return [
                {
                    "where": "at this scale, with the attention family" if family else None,
                    "command": scale_command(self.scale, family, self.scale) if family else REPRO,
                }
            ]
        return [
            {
                "where": f"at {scale} scale{', with the attention family' if holds[scale] else ''}",
                "command": scale_command(scale, holds[scale], self.scale),
            }
            for scale in SCALES
            if scale in holds
        ]

    def plan(self, runs: Sequence[str]) -> List[Dict[str, Any]]:
        """How to run ``runs`` (the runs of one row, or of several): groups of runs, each with its commands.

        One group, without run names, where a scale holds every run (the commands of those scales); else one
        group per set of scales, naming its runs.
        """
        runs = list(dict.fromkeys(r for r in runs if r))
        if not runs:
            return [{"runs": None, "options": [{"where": None, "command": REPRO}]}]
        held = {r: self.holds(r) for r in runs}
        common = set(SCALES)
        for h in held.values():
            common &= set(h)
        if common:
            merged = {s: any(held[r][s] for r in runs) for s in SCALES if s in common}
            return [{"runs": None, "options": self.options(merged)}]
        groups: Dict[Tuple, List[str]] = {}
        for r in runs:
            groups.setdefault(tuple(sorted(held[r].items())), []).append(r)
        out = []
        for key, names in groups.items():
            options = (
                self.options(dict(key))
                if key
                else [
                    {
                        "where": "in no scale's run list",
                        "command": f"add {', '.join(names)} to cls_runs / gen_runs (conf/scale/{self.scale}.yaml)",
                    }
                ]
            )
            out.append({"runs": names, "options": options})
        return out


def plan_text(plan: Sequence[Mapping[str, Any]]) -> str:
    """A plan (``HowToRun.plan``) in one line: "at smoke scale: CMD; or at paper scale: CMD", each group of
    several prefixed by its runs."""

    def options(group):
        return "; or ".join(f"{o['where']}: {o['command']}" if o["where"] else o["command"] for o in group["options"])

    if len(plan) == 1 and not plan[0]["runs"]:
        return options(plan[0])
    return " | ".join(f"{', '.join(g['runs'])}: {options(g)}" for g in plan)
