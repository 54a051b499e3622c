"""Training checkpoints: written atomically, loaded with ``weights_only=True`` (nothing is unpickled)."""
from __future__ import annotations

import hashlib
import io
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch


def previous_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".prev")


def save_checkpoint(path: str | Path, state: Dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, keeping the checkpoint it replaces as ``<path>.prev``.

    A crash at any moment leaves ``path`` either the old complete file or the new one;
    the previous generation is what :func:`load_checkpoint` falls back to should the
    newest one prove unreadable (a disk that lost the tail of a file, say).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        # through a buffer: saved to a path, torch names the archive's records after the (random)
        # temporary file, and identical states would not give identical bytes
        buffer = io.BytesIO()
        torch.save(state, buffer)
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        if path.is_file():
            os.replace(path, previous_path(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> Optional[Dict[str, Any]]:
    """The newest readable checkpoint at ``path`` or, failing that, ``<path>.prev``; None if neither exists.

    Loaded with ``weights_only=True``: tensors and plain containers only, nothing unpickled.
    """
    path = Path(path)
    for candidate in (path, previous_path(path)):
        if not candidate.is_file():
            continue
        try:
            return torch.load(candidate, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated or corrupt: say so and try the generation before it
            print(f"checkpoint {candidate} is unreadable ({type(err).__name__}: {err}); "
                  f"trying the previous one.", file=sys.stderr, flush=True)
    return None


def resumable_checkpoint(ckpt_dir: str | Path, fingerprint: str, seed: int, say) -> Optional[Dict[str, Any]]:
    """``ckpt_dir/last.pt`` if it was made with ``fingerprint``; otherwise None, said through ``say``."""
    path = Path(ckpt_dir) / "last.pt"
    state = load_checkpoint(path)
    if state is not None and state.get("fingerprint") != fingerprint:
        say(f"seed {seed}: {path} was made with other settings, code or data; starting afresh")
        return None
    return state


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
