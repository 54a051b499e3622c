"""Writing outputs so that a killed stage never leaves something that looks finished, nor a full disk a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional

from vcarepro.core.errors import DISK_FULL, DiskFull, disk_full_error, is_disk_full  # noqa: F401  (io's own names too)
from vcarepro.core.integrity import MANIFEST, remember, sha256_bytes, sha256_file, sidecar_path, sidecar_text


@contextmanager
def disk_full_names(path: str | Path, needed: Optional[int] = None) -> Iterator[None]:
    """A full disk or quota inside becomes :class:`DiskFull` naming ``path`` (and ``needed`` bytes, if known)."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as err:
        if is_disk_full(err):
            raise disk_full_error(err, path, needed) from None
        raise


_UMASK = os.umask(0o022)  # read once, at import (and set back at once): os.umask has no getter, and
os.umask(_UMASK)  # flipping it per file would race with threads that create files meanwhile


@contextmanager
def atomic_open(path: str | Path, needed: Optional[int] = None) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` only when the block ends without an error: a temporary file in the same
    directory, fsynced, then renamed over ``path``. A crash or an error inside leaves ``path`` as it was and no
    temporary file; a full disk is one sentence naming ``path`` (and the ``needed`` bytes, if known). For what is
    written piece by piece (a sample batch of gigabytes); :func:`write_bytes` for what is in memory. The file gets
    the permissions ``open`` would give it (0666 less the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with disk_full_names(path, needed):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:  # owns fd from here: closed whatever happens next
                os.fchmod(fd, 0o666 & ~_UMASK)
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_bytes(path: str | Path, data, digest: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_open`): a crash leaves ``path`` either as it was or
    complete. With ``digest``, its SHA-256 goes to ``<path>.sha256`` first (:mod:`vcarepro.core.integrity`), so a
    crash between the two renames leaves a mismatch, never a wrong match. A full disk is one sentence naming
    ``path`` and the bytes needed.
    """
    path = Path(path)
    checksum = sha256_bytes(data) if digest else None
    with atomic_open(path, memoryview(data).nbytes) as f:
        f.write(data)
        if checksum:
            f.flush()
            os.fsync(f.fileno())
            write_sidecar(path, checksum)  # before the rename: a crash between the two leaves a mismatch
    if checksum:
        remember(path, checksum)  # checking it later in this process reads nothing back
    return path


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, payload: Any, *, sort_keys: bool = True, end: str = "\n") -> None:
    """Write JSON atomically (:func:`write_bytes`): indented, keys sorted, a final newline.

    ``sort_keys=False, end=""``: the benchmarks' JSON, whose rows keep their fields' order.
    """
    write_bytes(path, (json.dumps(payload, indent=2, sort_keys=sort_keys) + end).encode())


def write_sidecar(path: str | Path, digest: Optional[str] = None) -> None:
    """Write ``<path>.sha256`` for ``path`` (hashing it unless ``digest`` is given)."""
    path = Path(path)
    write_bytes(sidecar_path(path), sidecar_text(path.name, digest or sha256_file(path)).encode())


def write_manifest(root: str | Path) -> Path:
    """``root/SHA256SUMS`` over every file below ``root`` (relative paths, sorted); written last."""
    root = Path(root)
    lines = [
        sidecar_text(p.relative_to(root).as_posix(), sha256_file(p))
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    ]
    return write_bytes(root / MANIFEST, "".join(lines).encode())


@contextmanager
def atomic_directory(path: str | Path, digests: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it into place only on success.

    A process killed inside leaves only its temporary directory, never ``path``; the
    next build of the same path removes such leftovers first. With ``digests``, a
    ``SHA256SUMS`` of every file is written last (:mod:`vcarepro.core.integrity`), which the
    stages that build on the directory check before use. A full disk inside names ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with disk_full_names(path):
            yield tmp
            if digests:
                write_manifest(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


NPZ_MEMBER_TIME = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: no member carries the time it was written


def write_npz_to(file, members) -> None:
    """``np.savez``'s format (stored members ``<name>.npy``) into the open binary ``file``, the same bytes under
    every CPython: each member's size is given to zipfile before it is written, and zip64 records are used only
    where a member needs them (2 GiB or more). ``np.savez`` forces zip64 on every member, and CPython wrote forced
    members differently before 3.11.4 (version 2.0 headers) than after (4.5), so Debian's 3.11.2 and this
    machine's 3.11.7 wrote the same samples as different bytes. ``members`` maps names to arrays, or to paths of
    ``.npy`` files, which are streamed (a paper-scale sample batch is gigabytes)."""
    import io as _io
    import shutil
    import zipfile

    import numpy as np

    with zipfile.ZipFile(file, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, member in members.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=NPZ_MEMBER_TIME)
            info.external_attr = 0o644 << 16
            if isinstance(member, (str, Path)):
                info.file_size = os.path.getsize(member)
                with (
                    open(member, "rb") as src,
                    archive.open(info, "w", force_zip64=info.file_size >= zipfile.ZIP64_LIMIT) as dst,
                ):
                    shutil.copyfileobj(src, dst, 1 << 24)
            else:
                buffer = _io.BytesIO()
                np.lib.format.write_array(buffer, np.asanyarray(member), allow_pickle=False)
                info.file_size = buffer.tell()
                with archive.open(info, "w", force_zip64=info.file_size >= zipfile.ZIP64_LIMIT) as dst:
                    dst.write(buffer.getvalue())


def write_npz(path: str | Path, arrays) -> Path:
    """:func:`write_npz_to` of in-memory ``arrays`` into ``path``, atomically (:func:`write_bytes`)."""
    import io as _io

    buffer = _io.BytesIO()
    write_npz_to(buffer, arrays)
    return write_bytes(path, buffer.getvalue())


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its header in one fixed order: ``__metadata__`` first, its keys sorted,
    then the tensors in the order of their data (the library's own). safetensors keeps ``__metadata__`` in a Rust
    HashMap, which iterates in a random order per process, so the same weights with two metadata keys were
    written as different bytes by half the runs (the digit extractor in data/gen). Values are untouched."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    ordered = {}
    if "__metadata__" in header:
        ordered["__metadata__"] = dict(sorted(header.pop("__metadata__").items()))
    ordered.update(sorted(header.items(), key=lambda item: (item[1]["data_offsets"][0], item[0])))
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the format pads its header with spaces to 8 bytes, as the library does
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def safetensors_bytes(tensors, metadata=None) -> bytes:
    """``safetensors.torch.save``'s bytes of ``tensors`` (contiguous, on the CPU), header in canonical order."""
    from safetensors.torch import save

    return canonical_safetensors(
        save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    )


def save_tensors(path: str | Path, tensors, metadata=None) -> Path:
    """:func:`safetensors_bytes` written by :func:`write_bytes`, with their digest ``<path>.sha256``."""
    return write_bytes(path, safetensors_bytes(tensors, metadata), digest=True)


def preallocate(path: str | Path) -> None:
    """Give ``path`` (a new, sparse ``open_memmap`` file) its disk blocks now (``posix_fallocate``).

    Written through a memory map, a sparse file on a full disk raises SIGBUS (a bus error, no
    message) at the first page that finds no block; allocated up front, a full disk is one
    sentence (:class:`DiskFull`) before any work goes into it.
    """
    path = Path(path)
    size = path.stat().st_size
    with disk_full_names(path, size):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: written without it
                raise OSError(err.errno, os.strerror(err.errno), str(path)) from None
        finally:
            os.close(fd)
