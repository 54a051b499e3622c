"""One writer for every file the project produces (vcarepro.core.io): what src/ writes, read with ``ast``.

Every call that writes a file outside core/io.py must be inside a block that makes it whole-or-nothing: ``with
atomic_directory(...)`` (a folder renamed into place), ``with atomic_open(...)`` (a file renamed into place) or a
scratch ``tempfile.TemporaryDirectory()``; or write into an in-memory buffer (``io.BytesIO()``) or stdout; or be on
the short list below, each with its reason. A new ``path.write_text(...)``, ``frame.to_csv(path)`` or
``torch.save(obj, path)`` anywhere else fails here: use ``vcarepro.core.io.write_bytes`` / ``write_text`` /
``write_json`` / ``atomic_open``, which write a temporary file beside the target, fsync it, rename it, and turn a
full disk into one sentence.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SRC = Path(__file__).resolve().parents[1] / "src" / "vcarepro"

# (file under src/vcarepro, function) -> why its writes are not io's
ALLOWED: Dict[Tuple[str, str], str] = {
    ("tools/cluster.py", "Driver.start_local"): "the local driver's log stream, written while it runs",
    ("tools/drift.py", "_step"): "a drift step's log stream, written while the step runs",
    ("tools/gpu_check/ddp.py", "launch"): "the launched ranks' output stream, written while they run",
    ("tools/cluster.py", "_DriverLock.__init__"): "a lock file held open for flock, never read for its content",
    ("tools/preflight/machine.py", "PeakMemory.__enter__"): "/proc/self/clear_refs: a kernel control file",
    ("data/imagenet.py", "_copy_member"): "streams one archive member into prepare_imagenet's atomic_directory",
    ("data/latents.py", "encode_to_shards"): "shards written into stages/prepare_gen.py's atomic_directory",
    ("metrics/fid_reference.py", "write_reference"): "writes into stages/fid_reference.py's atomic_directory",
    ("tools/standins.py", "write_released_checkpoints"): (
        "torch.save to the released name (torch names the archive's folder after the file, as in a released "
        "checkpoint), inside write_standins' atomic_directory"
    ),
    ("tools/bench/loader.py", "write_imagenet_like_jpegs"): "benchmark input images, in the benchmark's scratch folder",
}

SAFE_BLOCKS = {"atomic_directory", "atomic_open", "TemporaryDirectory"}
BUFFERS = {"BytesIO", "StringIO"}
WRITE_MODES = set("wax+")
FRAME_WRITERS = {"to_csv", "to_json", "to_parquet", "to_pickle", "to_excel", "to_markdown", "to_html", "to_feather"}
NUMPY_WRITERS = {"save", "savez", "savez_compressed", "savetxt"}


def _name(node: ast.AST) -> str:
    """``a.b.c`` of a Name / Attribute chain, '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else ""  # a call on an expression: (root / "x").open
    return ""


def _mode(call: ast.Call, position: int) -> Optional[str]:
    for keyword in call.keywords:
        if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        return str(call.args[position].value)
    return None


def _target(call: ast.Call, position: int, keywords=("path", "path_or_buf", "buf", "f", "fname", "file", "fp")):
    for keyword in call.keywords:
        if keyword.arg in keywords:
            return keyword.value
    return call.args[position] if len(call.args) > position else None


def writes(call: ast.Call) -> Optional[Tuple[str, Optional[ast.AST]]]:
    """(what, the file argument) when ``call`` writes a file, else None."""
    func = call.func
    full = _name(func)
    if any(keyword.arg == "fileobj" for keyword in call.keywords):  # tarfile / gzip over an open file: that one counts
        return None
    attr = func.attr if isinstance(func, ast.Attribute) else full
    if full in ("open", "os.fdopen", "io.open", "codecs.open"):
        mode = _mode(call, 1)
        return (f"{full}(..., {mode!r})", None) if mode and set(mode) & WRITE_MODES else None
    if attr == "open" and isinstance(func, ast.Attribute):  # Path.open(mode), tarfile.open(name, mode), gzip.open
        position = 1 if _name(func.value) in ("tarfile", "gzip", "bz2", "lzma", "zipfile") else 0
        mode = _mode(call, position)
        return (f"{full}(..., {mode!r})", None) if mode and set(mode) & WRITE_MODES else None
    if attr in ("ZipFile", "GzipFile", "TarFile"):
        mode = _mode(call, 1)
        return (f"{full}(..., {mode!r})", None) if mode and set(mode) & WRITE_MODES else None
    if attr in ("write_text", "write_bytes") and isinstance(func, ast.Attribute):
        if _name(func.value) in ("io", "core_io"):  # vcarepro.core.io's own, imported as a module
            return None
        return (f"{attr}", None)
    if attr in FRAME_WRITERS and isinstance(func, ast.Attribute):
        target = _target(call, 0)
        return (f"{attr}(path)", target) if target is not None else None  # to_csv() with no path returns text
    if isinstance(func, ast.Attribute) and _name(func.value) in ("np", "numpy") and attr in NUMPY_WRITERS:
        return (full, _target(call, 0))
    if full == "torch.save":
        return (full, _target(call, 1))
    if attr == "savefig":
        return ("savefig", _target(call, 0))
    if attr == "save" and isinstance(func, ast.Attribute) and call.args:  # Image.save(path), a stats file, ...
        return (_name(func) or "save", call.args[0])
    if full in ("shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move"):
        return (full, None)
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str):
        self.rel, self.scope, self.safe, self.buffers = rel, [], 0, [set()]
        self.found: List[Tuple[str, int, str, str]] = []  # (file, line, function, what)

    def _function(self, node):
        self.scope.append(node.name)
        self.buffers.append(set())
        self.generic_visit(node)
        self.buffers.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Assign(self, node):
        value = node.value
        if isinstance(value, ast.Call) and _name(value.func).split(".")[-1] in BUFFERS:
            self.buffers[-1].update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def _with(self, node):
        safe = any(
            isinstance(item.context_expr, ast.Call) and _name(item.context_expr.func).split(".")[-1] in SAFE_BLOCKS
            for item in node.items
        )
        for item in node.items:
            if safe and isinstance(item.optional_vars, ast.Name) and isinstance(item.context_expr, ast.Call):
                if _name(item.context_expr.func).split(".")[-1] == "atomic_open":
                    self.buffers[-1].add(item.optional_vars.id)  # the temporary file itself
            self.visit(item.context_expr)
        self.safe += safe
        for statement in node.body:
            self.visit(statement)
        self.safe -= safe

    visit_With = visit_AsyncWith = _with

    def visit_Call(self, node):
        found = writes(node)
        if found and not self.safe:
            what, target = found
            into_buffer = (isinstance(target, ast.Name) and target.id in self.buffers[-1]) or _name(target) in (
                "sys.stdout",
                "sys.stderr",
            )
            if not into_buffer:
                self.found.append((self.rel, node.lineno, ".".join(self.scope) or "<module>", what))
        self.generic_visit(node)


def unsafe_writes(root: Path = SRC) -> List[Tuple[str, int, str, str]]:
    """Every write outside io, a safe block, a buffer or the allow-list: (file, line, function, what)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "core/io.py":
            continue
        scan = _Scan(rel)
        scan.visit(ast.parse(path.read_text(), str(path)))
        found += [hit for hit in scan.found if (hit[0], hit[2]) not in ALLOWED]
    return found


def allowed_in_use(root: Path = SRC) -> set:
    used = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        scan = _Scan(rel)
        scan.visit(ast.parse(path.read_text(), str(path)))
        used |= {(hit[0], hit[2]) for hit in scan.found}
    return used


def test_every_file_src_writes_goes_through_core_io_or_a_listed_reason():
    found = unsafe_writes()
    assert not found, "files written outside vcarepro.core.io (use write_bytes / write_text / atomic_open):\n" + (
        "\n".join(f"  src/vcarepro/{f}:{line} in {fn}: {what}" for f, line, fn, what in found)
    )


def test_the_allow_list_is_short_and_every_entry_still_writes():
    assert len(ALLOWED) <= 10
    stale = set(ALLOWED) - allowed_in_use()
    assert not stale, f"allow-list entries that no longer write (remove them): {sorted(stale)}"


def test_the_scanner_finds_each_kind_of_write_and_passes_the_safe_ones(tmp_path):
    """The rule itself: each write form is caught outside a safe block, and none inside one or into a buffer."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import io, json, numpy as np, torch\n"
        "from vcarepro.core.io import atomic_directory, atomic_open\n"
        "def bad(path, frame, fig, image, state):\n"
        "    path.write_text('x')\n"
        "    path.write_bytes(b'x')\n"
        "    frame.to_csv(path, index=False)\n"
        "    open(path, 'w').write('x')\n"
        "    with path.open('a') as f:\n"
        "        f.write('x')\n"
        "    np.save(path, 1)\n"
        "    torch.save(state, path)\n"
        "    fig.savefig(path)\n"
        "    image.save(path)\n"
        "def good(path, frame, fig, image, state):\n"
        "    text = frame.to_csv(index=False)\n"
        "    buf = io.BytesIO()\n"
        "    fig.savefig(buf)\n"
        "    torch.save(state, buf)\n"
        "    open(path).read()\n"
        "    with atomic_directory(path) as tmp:\n"
        "        (tmp / 'a').write_text('x')\n"
        "        image.save(tmp / 'b.png')\n"
        "    with atomic_open(path) as f:\n"
        "        np.save(f, 1)\n"
    )
    found = unsafe_writes(package)
    assert [fn for _, _, fn, _ in found] == ["bad"] * 9, found
