"""One writer for every file the project produces (vcarepro.core.io): what src/ and stages/ write, read with ``ast``.

Every call that writes a file outside core/io.py must write whole-or-nothing: into the folder of a ``with
atomic_directory(...) as tmp`` (its path built from ``tmp``), into the file of a ``with atomic_open(...) as f``,
into a scratch ``tempfile.TemporaryDirectory()``, or into an in-memory buffer (``io.BytesIO()``) or stdout; or be
on the short list below, each with its reason. A new ``path.write_text(...)``, ``frame.to_csv(path)`` or
``torch.save(obj, path)`` anywhere else fails here: use ``vcarepro.core.io.write_bytes`` / ``write_text`` /
``write_json`` / ``atomic_open``, which write a temporary file beside the target, fsync it, rename it, and turn a
full disk into one sentence. A writer killed inside ``atomic_directory`` leaves nothing a reader would take.
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Set, Tuple

import pytest

from helpers import ROOT
from vcarepro.core.io import atomic_directory

SRC = ROOT / "src" / "vcarepro"
STAGES = ROOT / "stages"

# (file, function, what it calls) -> why that write is not io's
ALLOWED: Dict[Tuple[str, str, str], str] = {
    ("tools/cluster/driver.py", "Driver.start_local", "open"): "the local driver's log stream, written while it runs",
    ("tools/drift.py", "_step", "open"): "a drift step's log stream, written while the step runs",
    ("tools/cluster/cli.py", "_DriverLock.__init__", "open"): "a lock file held open for flock, never read",
    ("tools/bench/timing.py", "PeakMemory.__enter__", "write_text"): "/proc/self/clear_refs: a kernel control",
    ("train/seeds.py", "train_seeds", "Live"): "dvclive's logs, appended while training; DVC records them at the end",
    ("data/samples.py", "NpzSampleWriter._map", "open_memmap"): (
        "a sample batch's resumable work maps, preallocated (io.preallocate); each finished batch is digested"
    ),
    ("data/latents.py", "_open_shard", "np.save"): "shards written into stages/prepare_gen.py's atomic folder",
    ("data/latents.py", "_open_shard", "open_memmap"): "shards written into stages/prepare_gen.py's atomic folder",
    ("metrics/fid_reference.py", "write_reference", "save"): "into fid_reference's atomic folder (io.write_npz)",
    ("metrics/fid_reference.py", "write_reference", "np.save"): "into stages/fid_reference.py's atomic folder",
    ("train/sampling.py", "write_seed_samples", "save_image"): "the sample grid, into sample_gen's atomic folder",
    ("tools/standins.py", "write_random_vae", "save_pretrained"): "diffusers' VAE, in write_standins' atomic folder",
    ("tools/standins.py", "write_released_checkpoints", "torch.save"): (
        "torch.save to the released name (torch names the archive's folder after the file, as in a released "
        "checkpoint), inside write_standins' atomic folder"
    ),
    ("tools/bench/loader.py", "write_imagenet_like_jpegs", "save"): "benchmark input images, in its scratch folder",
}

SAFE_FOLDERS = {"atomic_directory", "TemporaryDirectory", "mkdtemp"}  # what is built from their name is scratch
BUFFERS = {"BytesIO", "StringIO"}
WRITE_MODES = set("wax+")
FRAME_WRITERS = {"to_csv", "to_json", "to_parquet", "to_pickle", "to_excel", "to_markdown", "to_html", "to_feather"}
NUMPY_WRITERS = {"save", "savez", "savez_compressed", "savetxt", "tofile"}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a Name / Attribute chain, '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""  # a call on an expression: (root / "x").open
    return ""


def _keyword(call: ast.Call, *names: str) -> Optional[ast.AST]:
    return next((k.value for k in call.keywords if k.arg in names), None)


def _arg(call: ast.Call, position: int, *names: str) -> Optional[ast.AST]:
    found = _keyword(call, *names)
    if found is not None:
        return found
    return call.args[position] if len(call.args) > position else None


def _writes_mode(call: ast.Call, position: int, default: str = "r") -> bool:
    """Whether the mode is a writing one; a mode the code computes counts as writing (it may be)."""
    mode = _arg(call, position, "mode")
    if mode is None:
        return bool(set(default) & WRITE_MODES)
    return not isinstance(mode, ast.Constant) or bool(set(str(mode.value)) & WRITE_MODES)


def writes(call: ast.Call) -> Optional[Tuple[str, Optional[ast.AST]]]:
    """(the writer's name, the expression naming the file written) when ``call`` writes a file, else None."""
    func = call.func
    full = _name(func)
    last = func.attr if isinstance(func, ast.Attribute) else full
    if _keyword(call, "fileobj") is not None:  # tarfile / gzip over an open file: that file's opening counts
        return None
    if full in ("open", "builtins.open", "io.open", "codecs.open"):
        return ("open", _arg(call, 0, "file")) if _writes_mode(call, 1) else None
    if full == "os.fdopen":
        return ("open", None) if _writes_mode(call, 1) else None
    if full == "os.open":
        flags = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in ast.walk(call.args[1])}
        return ("os.open", call.args[0]) if len(call.args) > 1 and flags & WRITE_FLAGS else None
    if isinstance(func, ast.Attribute) and last == "open":  # tarfile/gzip/bz2/lzma.open(name, mode), Path.open(mode)
        if _name(func.value) in ("tarfile", "gzip", "bz2", "lzma"):
            return ("open", _arg(call, 0, "name", "filename")) if _writes_mode(call, 1) else None
        mode = _arg(call, 0, "mode")  # Path.open's mode comes first; Image.open(path) and its kind are read-only
        constant = isinstance(mode, ast.Constant) and isinstance(mode.value, str)
        return ("open", func.value) if constant and set(mode.value) & WRITE_MODES else None
    if last in ("ZipFile", "GzipFile", "TarFile"):
        return (last, _arg(call, 0, "file", "filename", "name")) if _writes_mode(call, 1) else None
    if isinstance(func, ast.Attribute) and last in ("write_text", "write_bytes", "touch"):
        if _name(func.value) in ("io", "core_io"):  # vcarepro.core.io's own, imported as a module
            return None
        return (last, func.value)
    if isinstance(func, ast.Attribute) and last in FRAME_WRITERS:
        target = _arg(call, 0, "path_or_buf", "buf", "path")
        return (last, target) if target is not None else None  # to_csv() with no path returns text
    if isinstance(func, ast.Attribute) and _name(func.value) in ("np", "numpy") and last in NUMPY_WRITERS:
        return (full, _arg(call, 0, "file", "fname"))
    if last in ("open_memmap", "memmap"):
        return (
            (last, _arg(call, 0, "filename"))
            if _writes_mode(call, 1, "r+" if last == "open_memmap" else "r+")
            else None
        )
    if full == "torch.save":
        return (full, _arg(call, 1, "f"))
    if last in ("savefig", "save_image", "save_file", "save_for_hf", "save_pretrained", "Live"):
        position = {"savefig": 0, "save_image": 1, "save_file": 1, "save_for_hf": 1, "save_pretrained": 0, "Live": 0}
        return (last, _arg(call, position[last], "fname", "fp", "filename", "save_directory", "dir"))
    if isinstance(func, ast.Attribute) and last == "save" and (call.args or _keyword(call, "fp")):
        return ("save", _arg(call, 0, "fp"))  # Image.save(path), a statistics file, ...
    if full in ("shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move"):
        return (full, _arg(call, 1, "dst"))
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str):
        self.rel, self.scope = rel, []
        self.scratch: List[Set[str]] = [set()]  # names of atomic / temporary folders, per function
        self.buffers: List[Set[str]] = [set()]  # names of in-memory buffers and atomic_open's files, per function
        self.found: List[Tuple[str, int, str, str]] = []  # (file, line, function, writer)

    def _function(self, node):
        self.scope.append(node.name)
        self.scratch.append(set())
        self.buffers.append(set())
        self.generic_visit(node)
        self.buffers.pop()
        self.scratch.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Assign(self, node):
        value = node.value
        if isinstance(value, ast.Call):
            called = _name(value.func).split(".")[-1]
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if called in BUFFERS:
                self.buffers[-1].update(names)
            elif called in SAFE_FOLDERS:
                self.scratch[-1].update(names)
        if self._scratch(value):  # root = Path(tmp), path = root / "x": still inside the scratch folder
            self.scratch[-1].update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def _scratch(self, node: Optional[ast.AST]) -> bool:
        return node is not None and any(
            isinstance(n, ast.Name)
            and n.id in self.scratch[-1]
            or isinstance(n, ast.Call)
            and _name(n.func).split(".")[-1] in SAFE_FOLDERS
            for n in ast.walk(node)
        )

    def _with(self, node):
        for item in node.items:
            self.visit(item.context_expr)
            if isinstance(item.context_expr, ast.Call) and isinstance(item.optional_vars, ast.Name):
                called = _name(item.context_expr.func).split(".")[-1]
                if called == "atomic_open" or called in BUFFERS:
                    self.buffers[-1].add(item.optional_vars.id)  # the temporary file itself
                elif called in SAFE_FOLDERS:
                    self.scratch[-1].add(item.optional_vars.id)
        for statement in node.body:
            self.visit(statement)

    visit_With = visit_AsyncWith = _with

    def visit_Call(self, node):
        found = writes(node)
        if found:
            writer, target = found
            safe = (
                (isinstance(target, ast.Name) and target.id in self.buffers[-1])
                or (isinstance(target, ast.Constant) and isinstance(target.value, int))  # open(1, "w"): a descriptor
                or _name(target) in ("sys.stdout", "sys.stderr")
                or self._scratch(target)
            )
            if not safe:
                self.found.append((self.rel, node.lineno, ".".join(self.scope) or "<module>", writer))
        self.generic_visit(node)


def scan(roots=((SRC, ""), (STAGES, "stages/"))) -> List[Tuple[str, int, str, str]]:
    """Every write outside io, an atomic or scratch folder, an atomic file or a buffer: (file, line, function,
    writer)."""
    found = []
    for root, prefix in roots:
        for path in sorted(root.rglob("*.py")):
            rel = prefix + path.relative_to(root).as_posix()
            if rel == "core/io.py":
                continue
            visitor = _Scan(rel)
            visitor.visit(ast.parse(path.read_text(), str(path)))
            found += visitor.found
    return found


def unsafe_writes(roots=((SRC, ""), (STAGES, "stages/"))) -> List[Tuple[str, int, str, str]]:
    return [hit for hit in scan(roots) if (hit[0], hit[2], hit[3]) not in ALLOWED]


def test_every_file_src_writes_goes_through_core_io_or_a_listed_reason():
    found = unsafe_writes()
    assert not found, "files written outside vcarepro.core.io (use write_bytes / write_text / atomic_open):\n" + (
        "\n".join(f"  {f}:{line} in {fn}: {what}" for f, line, fn, what in found)
    )


def test_the_allow_list_is_short_and_every_entry_still_writes():
    assert len(ALLOWED) <= 14
    stale = set(ALLOWED) - {(f, fn, what) for f, _, fn, what in scan()}
    assert not stale, f"allow-list entries that no longer write (remove them): {sorted(stale)}"


def test_the_scanner_finds_each_kind_of_write_and_passes_the_safe_ones(tmp_path):
    """The rule itself: each write form is caught outside a safe place, and none into one or into a buffer."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import io, os, builtins, json, numpy as np, torch\n"
        "from numpy.lib.format import open_memmap\n"
        "from vcarepro.core.io import atomic_directory, atomic_open\n"
        "def bad(path, frame, fig, image, state, mode, vae):\n"
        "    path.write_text('x')\n"
        "    path.write_bytes(b'x')\n"
        "    path.touch()\n"
        "    frame.to_csv(path, index=False)\n"
        "    open(path, 'w').write('x')\n"
        "    open(path, mode)\n"
        "    builtins.open(path, 'a')\n"
        "    os.open(path, os.O_WRONLY | os.O_CREAT)\n"
        "    with path.open('a') as f:\n"
        "        f.write('x')\n"
        "    np.save(path, 1)\n"
        "    open_memmap(path, mode='w+', dtype='f4', shape=(1,))\n"
        "    torch.save(state, path)\n"
        "    fig.savefig(path)\n"
        "    image.save(path)\n"
        "    image.save(fp=path)\n"
        "    save_image(state, path)\n"
        "    vae.save_pretrained(path)\n"
        "    with atomic_directory(path) as tmp:\n"
        "        (path / 'beside').write_text('x')\n"
        "def good(path, frame, fig, image, state):\n"
        "    text = frame.to_csv(index=False)\n"
        "    buf = io.BytesIO()\n"
        "    fig.savefig(buf)\n"
        "    torch.save(state, buf)\n"
        "    open(path).read()\n"
        "    open_memmap(path, mode='r')\n"
        "    with atomic_directory(path) as tmp:\n"
        "        (tmp / 'a').write_text('x')\n"
        "        image.save(tmp / 'b.png')\n"
        "    with atomic_open(path) as f:\n"
        "        np.save(f, 1)\n"
    )
    found = unsafe_writes(((package, ""),))
    assert [fn for _, _, fn, _ in found] == ["bad"] * 18, found


KILLED_BUILD = """
import os, signal, sys
from vcarepro.core.io import atomic_directory
with atomic_directory(sys.argv[1]) as tmp:
    (tmp / "manifest.csv").write_text("half written")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_preparation_killed_midway_leaves_nothing_a_later_stage_would_accept(tmp_path):
    target = tmp_path / "data" / "cls"
    killed = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(target)], capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    assert not target.exists() and len(list(target.parent.glob(".cls.*.tmp"))) == 1  # only the scratch copy
    with atomic_directory(target) as tmp:
        (tmp / "manifest.csv").write_text("complete")
    assert (target / "manifest.csv").read_text() == "complete"
    assert list(target.parent.iterdir()) == [target]  # the leftover was cleared
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "manifest.csv").write_text("broken")
            raise RuntimeError("a failed rebuild")
    assert (target / "manifest.csv").read_text() == "complete" and list(target.parent.iterdir()) == [target]
