"""SHA-256 digests written with every file the project resumes from or builds on, checked before use.

``torch.load`` does not check a checkpoint zip's CRCs, safetensors and numpy check nothing, and DVC hashes
outputs only when it records them: without a digest, flipped bytes in a well-formed file are trained on.
Digests are in ``sha256sum``'s format: ``<file>.sha256`` beside a single file, one ``SHA256SUMS`` (written
last) for a prepared directory. :mod:`vcarepro.core.io` writes them; :func:`check` gives the reason a file
cannot be used (``None`` when intact), :func:`require_intact` one sentence with the fix. A file is hashed
once per process (size, mtime and inode key the memo).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from vcarepro.core.errors import BadInput, MissingInput

SIDECAR = ".sha256"
MANIFEST = "SHA256SUMS"
_CHUNK = 1 << 22
_memo: Dict[Tuple[str, int, int, int], str] = {}


class CorruptFile(BadInput):
    """A file whose bytes differ from the digest written with it (or that has no digest)."""


def sha256_bytes(data) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _memo:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                digest.update(chunk)
        _memo[key] = digest.hexdigest()
    return _memo[key]


def sidecar_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR)


def remember(path: str | Path, digest: str) -> None:
    """Record ``digest`` as ``path``'s (just written by this process), so checking it later reads nothing."""
    path = Path(path)
    st = path.stat()
    _memo[(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)] = digest


def sidecar_text(name: str, digest: str) -> str:
    return f"{digest}  {name}\n"


def _parse(text: str) -> Dict[str, str]:
    entries = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if sep and len(digest) == 64:
            entries[name] = digest
    return entries


def listing(folder: str | Path) -> Optional[Dict[str, str]]:
    """``folder``'s SHA256SUMS as {relative name: digest}, read once; None when it has none."""
    manifest = Path(folder) / MANIFEST
    return _parse(manifest.read_text()) if manifest.is_file() else None


def expected_digest(path: str | Path) -> Tuple[Optional[str], Optional[Path]]:
    """The digest recorded for ``path`` and the file that records it: its sidecar, else the manifest above it."""
    path = Path(path)
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        return _parse(sidecar.read_text()).get(path.name), sidecar
    for folder in path.parents:
        manifest = folder / MANIFEST
        if manifest.is_file():
            return _parse(manifest.read_text()).get(path.relative_to(folder).as_posix()), manifest
    return None, None


def check(path: str | Path, data: Optional[bytes] = None) -> Optional[str]:
    """Why ``path`` cannot be trusted ("fails its checksum", "has no checksum"), or None if it is intact.

    ``data``: its bytes, already read (hashed instead of reading the file again).
    """
    path = Path(path)
    expected, _ = expected_digest(path)
    if expected is None:
        return f"has no checksum ({sidecar_path(path).name} or a {MANIFEST} listing it)"
    actual = sha256_bytes(data) if data is not None else sha256_file(path)
    return None if actual == expected else "fails its checksum"


def require_intact(path: str | Path, fix: str) -> Path:
    """``path`` if it exists and matches its digest; otherwise :class:`CorruptFile` naming it and ``fix``."""
    path = Path(path)
    if path.is_file():
        problem = check(path)
        if problem is not None:
            consequence = "cannot be verified" if problem.startswith("has no") else "are not what was written"
            raise CorruptFile(f"{path} {problem}, so its bytes {consequence}; {fix}.")
    return path


def require_intact_directory(
    root: str | Path, fix: str, names: Optional[Iterable[str]] = None, without: Tuple[str, ...] = ()
) -> Path:
    """Every file ``root/SHA256SUMS`` lists (or just ``names``; none under the prefixes ``without``) exists and
    matches; else one sentence with ``fix``."""
    root = Path(root)
    manifest = root / MANIFEST
    entries = listing(root)
    if entries is None:
        raise CorruptFile(
            f"{root} has no {MANIFEST}, so its files cannot be verified (it was written by an older "
            f"version or by hand); {fix}."
        )
    for name in sorted(entries) if names is None else names:
        if name.startswith(without):
            continue
        path = root / name
        if name not in entries or not path.is_file():
            raise CorruptFile(f"{path} is {'missing' if name in entries else f'not listed in {manifest}'}; {fix}.")
        if sha256_file(path) != entries[name]:
            raise CorruptFile(f"{path} fails its checksum, so its bytes are not what was written; {fix}.")
    return root


def prepared(
    root: str | Path, stage: str, names: Optional[Iterable[str]] = None, without: Tuple[str, ...] = ()
) -> Path:
    """A directory a DVC stage wrote with digests (``atomic_directory(..., digests=True)``), verified before use.

    ``without``: prefixes of files this reader does not read (the 42 GB of latent shards, for a stage
    that reads only ``meta.json`` and the FID extractor).
    """
    if not Path(root).is_dir():
        raise MissingInput(f"{root} is missing; build it with `dvc repro {stage}`.")
    return require_intact_directory(
        root,
        f"restore it with `dvc checkout {root}` (DVC's cache keeps the bytes it recorded) or rebuild it with "
        f"`dvc repro -f -s {stage}`",
        names,
        without,
    )


def intact_file(path: str | Path, stage: str) -> Path:
    """A file a stage wrote with its digest (weights), verified before use: one sentence with the fix otherwise."""
    return require_intact(path, f"restore it with `dvc checkout` or rebuild it with `dvc repro -f -s {stage}`")
