"""What the disk bill comes to on this machine: the filesystem each output family lands on and its free space, DVC's
cache (its folder, and whether it links each output or stores a second copy), the stages that read each output on
DVC's own graph of the scale, DVC's time to hash the files and to check them in a no-change ``dvc status`` from rates
timed here, and the sentence that refuses runs a filesystem cannot hold."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import yaml

from vcarepro.params.config import REPO_ROOT
from vcarepro.tools.bench.timing import GIB
from vcarepro.tools.preflight.footprint import Family, Output, families, files_bytes
from vcarepro.tools.preflight.table import fmt

# Filesystems whose files DVC can clone (reflink). XFS can or cannot, as it was made (mkfs.xfs -m reflink=): it is
# assumed not to, which at worst counts a second copy that will not be made.
REFLINK_FILESYSTEMS = frozenset({"btrfs", "bcachefs", "ocfs2"})
STORED_IN_CACHE = ("copy", "symlink")  # the cache's filesystem holds these outputs' bytes too
CALIBRATION_FILES = 500
CALIBRATION_BYTES = 32 << 20


@dataclass(frozen=True)
class Place:
    device: int
    mount: str
    fstype: str
    free: int


def place_of(path: Path) -> Place:
    """The filesystem ``path`` lands on (that of its nearest existing folder): device, mount point, type, free bytes."""
    import psutil

    here = Path(path).absolute()
    while not here.exists():
        here = here.parent
    mount = here
    while not os.path.ismount(mount):
        mount = mount.parent
    types = {p.mountpoint: p.fstype for p in psutil.disk_partitions(all=True)}
    return Place(here.stat().st_dev, str(mount), types.get(str(mount), "unknown"), shutil.disk_usage(here).free)


def cache_link(types: Sequence[str], output: Place, cache: Place) -> str:
    """How DVC's cache will hold an output a stage wrote on ``output``, the cache on ``cache``, as DVC does it: with
    reflink first it cannot tell a reflink from a copy, so it leaves the output as written and the cache gets a clone
    where the filesystem clones, else a copy; otherwise it relinks the output with the first of ``types`` that can
    work there. A reflink and a hardlink need one device (a reflink also a filesystem that clones); a symlink and a
    copy work anywhere; 'none' where nothing can (DVC then fails to check the output out)."""
    same = output.device == cache.device
    clones = same and output.fstype in REFLINK_FILESYSTEMS
    if types and types[0] == "reflink":
        return "reflink" if clones else "copy"
    for kind in types:
        if kind in STORED_IN_CACHE or (kind == "reflink" and clones) or (kind == "hardlink" and same):
            return kind
    return "none"


def cache_setup(root: Path = REPO_ROOT) -> Tuple[List[str], Path]:
    """(the link types DVC's cache tries, in order; the cache's folder), as DVC reads them from ``root``'s config, its
    own defaults where nothing is set or ``root`` is no DVC repository."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        with Repo(str(root)) as repo:
            return list(repo.cache.local.cache_types), Path(repo.cache.local_cache_dir)
    except NotDvcRepoError:
        from dvc_data.hashfile.db.local import LocalHashFileDB

        return list(LocalHashFileDB.DEFAULT_CACHE_TYPES), root / ".dvc" / "cache"


@functools.lru_cache(maxsize=None)
def _stage_deps(params_yaml: str, dvc_yaml: str) -> Tuple[Tuple[str, ...], ...]:
    """Every stage's deps as DVC expands ``dvc_yaml`` over ``params_yaml`` (foreach over the runs), in a scratch
    repository: DVC's own graph of the scale's pipeline, not the workspace's params.yaml."""
    from dvc.repo import Repo

    from vcarepro.core.io import write_text

    with tempfile.TemporaryDirectory(prefix="preflight-graph-") as tmp:
        write_text(Path(tmp) / "dvc.yaml", dvc_yaml)
        write_text(Path(tmp) / "params.yaml", params_yaml)
        write_text(Path(tmp) / ".dvc" / "config", "[core]\n    no_scm = true\n")
        with Repo(tmp) as repo:
            return tuple(tuple(d.def_path for d in stage.deps) for stage in repo.index.stages)


def readers(params: Dict[str, Any], paths: Sequence[str], dvc_yaml: Path = REPO_ROOT / "dvc.yaml") -> Dict[str, int]:
    """For each of ``paths``, the stages whose deps hold it whole (the path, or a folder above it: the report's
    ``runs``). A stage that reads one file inside it (sample_gen's data/gen/meta.json) checks that file alone."""
    stages = _stage_deps(yaml.safe_dump(params, sort_keys=False), dvc_yaml.read_text())
    return {p: sum(any(p == d or p.startswith(d.rstrip("/") + "/") for d in deps) for deps in stages) for p in paths}


@dataclass(frozen=True)
class Rates:
    md5_bytes_per_s: float  # hashlib.md5, which DVC hashes with
    hash_file_s: float  # dvc-data's build() a file, not in DVC's state yet: hashed and recorded
    check_file_s: float  # the same, found unchanged in the state: what a no-change dvc status does per file and stage
    files: int  # the files timed
    where: str  # the folder they were timed in

    def hash_s(self, files: int, size: int) -> float:
        return files * self.hash_file_s + size / self.md5_bytes_per_s

    def status_s(self, files: int, checks: int) -> float:
        return files * checks * self.check_file_s


def _seconds(fn, repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``fn``, on its own clock (the steps' timer may be a test's)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _build_seconds(folder: Path, state_dir: Path) -> float:
    """Seconds of dvc-data's build() of ``folder`` into a scratch cache with DVC's state in ``state_dir``."""
    from dvc.fs import LocalFileSystem
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db.local import LocalHashFileDB
    from dvc_data.hashfile.state import State

    fs, state = LocalFileSystem(), State(root_dir=str(folder.parent), tmp_dir=str(state_dir))
    try:
        odb = LocalHashFileDB(fs, str(folder.parent / "cache"), state=state)
        return _seconds(lambda: build(odb, str(folder), fs, "md5"), 1)
    finally:
        state.close()


@functools.lru_cache(maxsize=None)
def calibrate(files: int = CALIBRATION_FILES, size: int = CALIBRATION_BYTES) -> Rates:
    """This machine's rates, once a process: hashlib.md5 over ``size`` bytes; dvc-data's build() over ``files`` small
    files in a scratch folder, three times from an empty state (hashing) and three times more on the last one
    (checking); the median of each."""
    data = os.urandom(size)
    md5 = size / _seconds(lambda: hashlib.md5(data).digest(), 3)
    with tempfile.TemporaryDirectory(prefix="preflight-dvc-") as tmp:
        folder = Path(tmp) / "files"
        folder.mkdir()
        for k in range(files):
            (folder / f"{k:05d}").write_bytes(data[k * 100 : (k + 1) * 100])
        hashing = statistics.median(_build_seconds(folder, Path(tmp) / f"state{n}") for n in range(3))
        checking = statistics.median(_build_seconds(folder, Path(tmp) / "state2") for _ in range(3))
    return Rates(md5, hashing / files, checking / files, files, tempfile.gettempdir())


@dataclass
class Bill:
    families: List[Family]
    cache: Family  # DVC's cache: the bytes it holds beyond the outputs, and its objects
    cache_types: List[str]
    rates: Rates

    def needs(self) -> Dict[int, Tuple[Family, int, List[str]]]:
        """Per device: (a family there, the new bytes it must hold, what they are)."""
        found: Dict[int, Tuple[Family, int, List[str]]] = {}
        for family in [*self.families, self.cache]:
            new = max(family.bytes - family.present, 0)
            first, total, parts = found.get(family.device, (family, 0, []))
            found[family.device] = (first, total + new, parts + [f"{family.name} {fmt(new / GIB, 3)} GiB"] * bool(new))
        return found

    def shortfalls(self) -> List[str]:
        """One sentence for each filesystem with less free space than the selected runs will put there."""
        return [
            f"the filesystem at {at.filesystem} has {fmt(at.free / GIB, 3)} GiB free, and the selected runs need "
            f"{fmt(need / GIB, 3)} GiB there ({', '.join(parts)}): free {fmt((need - at.free) / GIB, 3)} GiB there, "
            "or point what does not fit at a larger filesystem (DVC's cache: dvc cache dir PATH; checkpoints/ and "
            "runs/: a link), or check fewer runs (--runs); nothing was stepped or written."
            for at, need, parts in self.needs().values()
            if need > at.free
        ]

    def total(self) -> Dict[str, float]:
        """The bytes of every family and the cache's; the files DVC tracks and its seconds, over the families."""
        return {
            "bytes": sum(f.bytes for f in [*self.families, self.cache]),
            "files": sum(f.files for f in self.families),
            "hash_s": sum(f.hash_s or 0.0 for f in self.families),
            "status_s": sum(f.status_s or 0.0 for f in self.families),
        }

    def as_json(self) -> Dict[str, Any]:
        def entry(family: Family) -> Dict[str, Any]:
            return {**asdict(family), "bytes": family.bytes, "files": family.files}

        return {
            "cache_types": self.cache_types,
            "rates": asdict(self.rates),
            "families": [entry(f) for f in self.families],
            "cache": entry(self.cache),
            "total": self.total(),
        }


def _settle(family: Family, at: Place, cache: Place, types: Sequence[str], reading: Dict[str, int], rates: Rates):
    """``family`` placed on this machine: its filesystem, what is there already, and what DVC makes of it."""
    family.device, family.filesystem, family.free = at.device, f"{at.mount} ({at.fstype})", at.free
    family.present = sum(files_bytes(Path(o.path))[1] for o in family.outputs if Path(o.path).exists())
    if family.files:
        for output in family.outputs:
            output.readers = reading[output.path]
        family.cache = cache_link(types, at, cache)
        family.hash_s = rates.hash_s(family.files, family.bytes)
        family.status_s = sum(rates.status_s(o.files, 1 + o.readers) for o in family.outputs)


def bill(params: Dict[str, Any], branches: Sequence[Any], root: Path = REPO_ROOT) -> Bill:
    """The disk and DVC bill of the selected runs of ``branches`` (cls, gen) at the scale of ``params``."""
    found = families(params, branches)
    types, cache_dir = cache_setup(root)
    cache_at = place_of(cache_dir)
    reading = readers(params, [o.path for f in found for o in f.outputs if o.files])
    rates = calibrate()
    for family in found:
        _settle(family, place_of(Path(family.outputs[0].path)), cache_at, types, reading, rates)
    tracked = [f for f in found if f.files]
    copied = sum(max(f.bytes - f.present, 0) for f in tracked if f.cache in STORED_IN_CACHE)
    objects = sum(f.files + len(f.outputs) for f in tracked)  # each file, and each folder's .dir listing
    cache = Family("DVC cache", str(cache_dir), [Output(str(cache_dir), copied, objects)], cache="-")
    cache.device, cache.filesystem, cache.free = cache_at.device, f"{cache_at.mount} ({cache_at.fstype})", cache_at.free
    return Bill(found, cache, types, rates)
