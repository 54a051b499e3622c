"""Training checkpoints: written atomically with their digest, verified and loaded with ``weights_only=True``."""

from __future__ import annotations

import hashlib
import io
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from vcarepro.core.integrity import check, expected_digest
from vcarepro.core.io import write_bytes, write_sidecar


def previous_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".prev")


def save_checkpoint(path: str | Path, state: Dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically with its digest (``<path>.sha256``), keeping the one it replaces.

    The replaced checkpoint becomes ``<path>.prev`` (with its digest), what loading falls back to,
    but only if it is itself intact: a damaged newest file is overwritten, so a run that fell back
    to ``.prev`` never rotates the damage over its one good copy. A crash at any moment leaves the
    newest complete state in ``path`` or, between the rotation and the write, in ``.prev``; a
    file whose digest does not match is never loaded (:func:`load_checkpoint`).
    """
    path = Path(path)
    # through a buffer: saved to a path, torch names the archive's records after the (random)
    # temporary file, and identical states would not give identical bytes
    buffer = io.BytesIO()
    torch.save(state, buffer)
    if path.is_file() and check(path) is None:  # a crash from here on leaves .prev, the newest complete state
        write_sidecar(previous_path(path), expected_digest(path)[0])
        os.replace(path, previous_path(path))
    write_bytes(path, buffer.getbuffer(), digest=True)


def load_checkpoint(path: str | Path, problems: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """The newest intact checkpoint at ``path`` or, failing that, ``<path>.prev``; None if neither is.

    Intact: its bytes match the digest written with it, and it loads with ``weights_only=True``
    (tensors and plain containers only, nothing unpickled). Each candidate passed over adds
    "<file> <why>" to ``problems``; the file actually loaded is ``state["_loaded_from"]``.
    """
    path = Path(path)
    problems = [] if problems is None else problems
    for candidate in (path, previous_path(path)):
        if not candidate.is_file():
            continue
        problem = check(candidate)  # streamed: a 10 GB checkpoint is not held twice in memory
        if problem is None:
            try:
                state = torch.load(candidate, map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - a file that matches its digest but torch cannot read
                problem = f"is unreadable ({type(err).__name__})"
            else:
                state["_loaded_from"] = str(candidate)
                return state
        problems.append(f"{candidate} {problem}")
    return None


def what_changed(old: Any, new: Any) -> str:
    """The facts that differ between two run identities (``{"facts": stage facts, "seed": ...}``, as the
    training stages make them from ``vcarepro.params.stage_facts``), named as dvc.yaml names them.

    e.g. ``"train_cls@deit_tiny-mhsa's params numerics; deps src/vcarepro/core/numerics.py"``; empty where
    nothing can be named (an identity that is not such a mapping).
    """
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return ""
    old_facts, new_facts = old.get("facts") or {}, new.get("facts") or {}
    names: List[str] = []
    for kind in ("params", "deps"):
        a, b = old_facts.get(kind) or {}, new_facts.get(kind) or {}
        differ = sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...))
        if differ:
            names.append(f"{kind} {', '.join(differ)}")
    if old_facts.get("stage") != new_facts.get("stage"):
        names.append(f"stage {old_facts.get('stage')} -> {new_facts.get('stage')}")
    names.extend(
        f"{k} {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if k != "facts" and old.get(k) != new.get(k)
    )  # e.g. max_steps
    stage = new_facts.get("stage")
    return (f"{stage}'s " if stage and names else "") + "; ".join(names)


def resumable_checkpoint(ckpt_dir: str | Path, fingerprint: Any, seed: int, say) -> Optional[Dict[str, Any]]:
    """``ckpt_dir/last.pt`` (or its ``.prev``) if intact and made with ``fingerprint``; otherwise None.

    ``fingerprint`` identifies the run: the training stages pass ``{"facts": stage_facts(stage), "seed": ...}``
    (:mod:`vcarepro.params.stage_facts`: every param value and dependency hash DVC keys the stage on), so a
    checkpoint is resumed only under exactly the facts its results will be recorded with.

    Why nothing can be resumed is said through ``say`` in one sentence; the files passed over on
    the way to the one loaded are kept in ``state["_passed_over"]`` for :func:`resume_message`.
    """
    path = Path(ckpt_dir) / "last.pt"
    problems: List[str] = []
    state = load_checkpoint(path, problems)
    if state is None:
        if problems:
            say(f"seed {seed}: checkpoint {' and '.join(problems)}; starting afresh")
        return None
    if state.get("fingerprint") != fingerprint:
        changed = what_changed(state.get("fingerprint"), fingerprint)
        say(
            f"seed {seed}: {state['_loaded_from']} was written under other "
            + (f"facts ({changed})" if changed else "settings, code or data")
            + "; starting afresh"
        )
        return None
    state["_passed_over"] = problems
    return state


@dataclass
class TrainingState:
    """What a training loop carries and its checkpoint holds: the model, its EMA, the optimizer, the scheduler (the
    classifiers'), the precision's loss scaler, and how far it got (the epoch being trained, the optimizer steps)."""

    model: Any
    ema: Any
    optimizer: Any
    scaler: Any  # a MixedPrecision
    scheduler: Any = None
    epoch: int = 0
    step: int = 0

    def parts(self) -> Dict[str, Any]:
        """The checkpoint's state dicts, under these keys (an EMA that is off is saved as {})."""
        scheduler = {} if self.scheduler is None else {"scheduler": self.scheduler}
        return {"model": self.model, "optimizer": self.optimizer, **scheduler, "ema": self.ema, "scaler": self.scaler}

    def write(self, path: str | Path, **position: Any) -> None:
        """The checkpoint at ``path`` (:func:`save_training`: atomic, with its digest, the previous one kept)."""
        save_training(path, self.parts(), **position)

    def resume(self, ckpt_dir: str | Path, fingerprint: Any, seed: int, say) -> Optional[Dict[str, Any]]:
        return resume_training(ckpt_dir, fingerprint, seed, say, self.parts())


def save_training(path: str | Path, parts: Dict[str, Any], **position: Any) -> None:
    """A training checkpoint: the state dict of each of ``parts`` (model, optimizer, ...) under its key, {} for one
    that is None (not in this run), then ``position`` (how far, the history, the fingerprint), in that order."""
    heads = {name: part.state_dict() if part is not None else {} for name, part in parts.items()}
    save_checkpoint(path, {**heads, **position})


def resume_training(ckpt_dir: str | Path, fingerprint: Any, seed: int, say, parts: Dict[str, Any]):
    """:func:`resumable_checkpoint`'s state, loaded into ``parts`` as :func:`save_training` saved them; or None."""
    state = resumable_checkpoint(ckpt_dir, fingerprint, seed, say)
    if state is not None:
        for name, part in parts.items():
            if part is not None:
                part.load_state_dict(state[name])
    return state


def resume_message(seed: int, state: Dict[str, Any], position: str, finished: bool) -> str:
    """One sentence: what was passed over (a damaged newest checkpoint), the file loaded, and where it resumes.

    e.g. "seed 2: checkpoint ckpt/last.pt fails its checksum; resuming at epoch 9 of 15 from ckpt/last.pt.prev".
    """
    passed = state.get("_passed_over") or []
    head = f"seed {seed}: " + "".join(f"checkpoint {p}; " for p in passed)
    loaded = state["_loaded_from"]
    return head + (
        f"already trained ({position} in {loaded}); writing its outputs"
        if finished
        else f"resuming at {position} from {loaded}"
    )


def stream_seed(seed: int, rank: int, position: int) -> int:
    """One seed per (run seed, rank, epoch or step): random streams that restart exactly on resume.

    Reseeding at every boundary from these three numbers alone means a resumed run, on any
    rank, draws what an uninterrupted one would, without restoring saved RNG states.
    """
    digest = hashlib.blake2b(f"{seed}/{rank}/{position}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")  # < 2**32, as numpy's legacy seeding requires


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
