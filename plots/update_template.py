#!/usr/bin/env python3
"""Write plots/offline.html, DVC's plot page with Vega, Vega-Lite and Vega-Embed inlined, so `dvc plots show` draws
its charts without a network (DVC's own page loads the three libraries from cdn.jsdelivr.net).

    python plots/update_template.py                      # npm pack the pinned versions, verify them, write the page
    python plots/update_template.py vega-5.20.2.tgz vega-lite-5.2.0.tgz vega-embed-6.18.2.tgz
                                                         # the same from the tarballs `npm pack` already fetched
    python plots/update_template.py --check              # offline: is the committed page what this script writes?
    python plots/update_template.py --pins-for vega@5.21.0 vega-lite@5.2.0 vega-embed@6.18.2
                                                         # print new PINS lines to paste below (to update the pins)

Each tarball's sha512 must equal its pinned npm integrity and each inlined file's sha256 its pinned digest, or
nothing is written. The page keeps DVC's placeholders {plot_divs} and {refresh_tag} and leaves out DVC's
{scripts} (where DVC would put its CDN tags). `.dvc/config` names the page (`plots.html_template`; DVC reads a
relative path there from the .dvc/ directory). Each package's LICENSE goes to plots/licences/. Standard library only.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple


class Pin(NamedTuple):
    name: str
    version: str
    integrity: str      # npm's dist.integrity of the tarball (`npm view NAME@VERSION dist.integrity`)
    file: str           # the browser build inlined, inside the tarball's package/ folder
    sha256: str         # of that file
    licence_sha256: str  # of package/LICENSE

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


# The versions dvc_render 1.0.2's VegaRenderer.SCRIPTS loads from the CDN. Loaded in this order: vega-embed needs the
# globals `vega` and `vegaLite`.
PINS: Tuple[Pin, ...] = (
    Pin("vega", "5.20.2",
        "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5jQ80EVw==",
        "build/vega.min.js", "4794d0169cb1f3ebad8117fe98ba5bd652dd725905ec0384e832391dbccb03be",
        "0af895a1dac4df349658e87c9605638d5b79f86bc8533dfb8e43a05c18dca92d"),
    Pin("vega-lite", "5.2.0",
        "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
        "build/vega-lite.min.js", "d73157451b3978015ab31dacd55ff90d986ab8663fc0abed50f97b3cd90002cb",
        "f618900fd0d64046963b29f40590cdd1e341a2f41449f99110d82fd81fea808c"),
    Pin("vega-embed", "6.18.2",
        "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
        "build/vega-embed.min.js", "1ba9826431ddc9805e815ad92acc811c819f2bfd32bda2a128b8c4b5070fab5e",
        "32df67148f0fc3db0eb9e263a7b75d07f1eb14c61955005a4a39c6918d10d137"),
)

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "offline.html"
LICENCES = HERE / "licences"
PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")  # what dvc_render's HTML.embed() replaces, in order
# Text that would end the inline <script> early or change how the HTML parser reads it.
UNSAFE_IN_SCRIPT = re.compile(r"</script|<script|<!--", re.I)

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {{refresh_tag}}
    <title>DVC Plot</title>
    <!-- Written by plots/update_template.py; do not edit by hand (tests/test_plots_offline.py checks it).
         {names} from the npm registry, inlined so that the page needs no network.
         Their licences: plots/licences/. -->
{scripts}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""

SCRIPT = re.compile(r'<script data-package="(?P<spec>[^"]+)" data-sha256="(?P<sha>[0-9a-f]{64})"'
                    r'(?: src="data:text/javascript;base64,(?P<b64>[A-Za-z0-9+/=]*)">|>(?P<js>.*?))</script>', re.S)


class PinError(RuntimeError):
    """A tarball or file is not the pinned one."""


def npm_integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unpack(tarball: bytes, file: str) -> Tuple[bytes, bytes]:
    """(the file, LICENSE) from an npm tarball."""
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise PinError(f"package/{name} is not a file in the tarball")
            return member.read()
        try:
            return read(file), read("LICENSE")
        except KeyError as err:
            raise PinError(f"the tarball has no {err}") from None


def verified(pin: Pin, tarball: bytes) -> Tuple[str, bytes]:
    """(the library's text, its licence) from ``tarball``, which must be the pinned one."""
    got = npm_integrity(tarball)
    if got != pin.integrity:
        raise PinError(f"{pin.spec}: the tarball's integrity is {got}, not the pinned {pin.integrity}")
    js, licence = unpack(tarball, pin.file)
    if sha256(js) != pin.sha256:
        raise PinError(f"{pin.spec}: {pin.file} has sha256 {sha256(js)}, not the pinned {pin.sha256}")
    if sha256(licence) != pin.licence_sha256:
        raise PinError(f"{pin.spec}: LICENSE has sha256 {sha256(licence)}, not the pinned {pin.licence_sha256}")
    return js.decode("utf-8"), licence


def npm_pack(spec: str, into: Path) -> Path:
    """The registry's tarball of ``spec`` (NAME@VERSION), fetched by `npm pack` into ``into``."""
    out = subprocess.run(["npm", "pack", spec, "--json"], cwd=into, check=True, capture_output=True, text=True).stdout
    return into / json.loads(out)[0]["filename"]


def script_tag(pin: Pin, js: str) -> str:
    """The library inline; as a base64 data: URI if its text holds a DVC placeholder (dvc_render replaces them
    anywhere in the page) or something that would end or disturb an inline <script>."""
    head = f'    <script data-package="{pin.spec}" data-sha256="{sha256(js.encode("utf-8"))}"'
    if any(p in js for p in PLACEHOLDERS) or UNSAFE_IN_SCRIPT.search(js):
        encoded = base64.b64encode(js.encode("utf-8")).decode("ascii")
        return head + f' src="data:text/javascript;base64,{encoded}"></script>'
    return head + f">{js}</script>"


def render(libraries: Sequence[Tuple[Pin, str]]) -> str:
    """The page, given each pin's library text."""
    names = ", ".join(f"{pin.name} {pin.version}" for pin, _ in libraries)
    return PAGE.format(names=names, scripts="\n".join(script_tag(pin, js) for pin, js in libraries))


def inlined(page: str) -> List[Tuple[str, str, str]]:
    """(NAME@VERSION, data-sha256, library text) of each library in ``page``."""
    found = []
    for m in SCRIPT.finditer(page):
        js = base64.b64decode(m["b64"]).decode("utf-8") if m["b64"] is not None else m["js"]
        found.append((m["spec"], m["sha"], js))
    return found


def check(page: str, licences: Optional[Dict[str, bytes]] = None, pins: Sequence[Pin] = PINS) -> List[str]:
    """What is wrong with ``page`` (and the licence files, NAME -> bytes), one line each; [] if it is exactly what
    this script writes from the pinned libraries. Offline: the libraries' texts are read back from the page."""
    problems = []
    for placeholder, wanted in (("{plot_divs}", 1), ("{refresh_tag}", 1), ("{scripts}", 0)):
        if page.count(placeholder) != wanted:
            problems.append(f"the page holds {placeholder} {page.count(placeholder)} times, not {wanted}")
    found = inlined(page)
    if [spec for spec, _, _ in found] != [pin.spec for pin in pins]:
        problems.append(f"the page inlines {[s for s, _, _ in found]}, not the pins {[p.spec for p in pins]}")
        return problems
    for pin, (spec, recorded, js) in zip(pins, found):
        digest = sha256(js.encode("utf-8"))
        if digest != pin.sha256:
            problems.append(f"{spec}: the inlined text has sha256 {digest}, not the pinned {pin.sha256}")
        if recorded != pin.sha256:
            problems.append(f"{spec}: the page records sha256 {recorded}, not the pinned {pin.sha256}")
    if not problems and render([(pin, js) for pin, (_, _, js) in zip(pins, found)]) != page:
        problems.append("the page differs from what plots/update_template.py writes (edited by hand?); run it again")
    for pin in pins if licences is not None else ():
        text = licences.get(pin.name)
        if text is None or sha256(text) != pin.licence_sha256:
            problems.append(f"plots/licences/{pin.name}-LICENSE is missing or not {pin.spec}'s LICENSE")
    return problems


def licence_files(folder: Path = LICENCES) -> Dict[str, bytes]:
    return {path.name[:-len("-LICENSE")]: path.read_bytes() for path in folder.glob("*-LICENSE")}


def write(libraries: Sequence[Tuple[Pin, str, bytes]], template: Path = TEMPLATE, licences: Path = LICENCES) -> None:
    licences.mkdir(parents=True, exist_ok=True)
    for pin, _, licence in libraries:
        (licences / f"{pin.name}-LICENSE").write_bytes(licence)
    template.write_bytes(render([(pin, js) for pin, js, _ in libraries]).encode("utf-8"))


def pins_for(specs: Sequence[str]) -> str:
    """PINS lines for ``specs`` (NAME@VERSION), from the registry's tarballs (after npm checked their integrity)."""
    files = {pin.name: pin.file for pin in PINS}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            name, _, version = spec.rpartition("@")
            tarball = npm_pack(spec, Path(tmp)).read_bytes()
            js, licence = unpack(tarball, files[name])
            lines.append(f'    Pin("{name}", "{version}",\n        "{npm_integrity(tarball)}",\n'
                         f'        "{files[name]}", "{sha256(js)}",\n        "{sha256(licence)}"),')
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tarballs", nargs="*", type=Path, help=f"npm tarballs of {', '.join(p.spec for p in PINS)}")
    parser.add_argument("--check", action="store_true", help="only check the committed page and licences (offline)")
    parser.add_argument("--pins-for", nargs="+", metavar="NAME@VERSION", help="print PINS lines for these versions")
    args = parser.parse_args(argv)
    if args.pins_for:
        print(pins_for(args.pins_for))
        return 0
    if args.check:
        problems = check(TEMPLATE.read_text(encoding="utf-8"), licence_files())
        for line in problems:
            print(line)
        print(f"{TEMPLATE.name}: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
        return 1 if problems else 0
    if args.tarballs and len(args.tarballs) != len(PINS):
        parser.error(f"give all {len(PINS)} tarballs ({', '.join(p.spec for p in PINS)}) or none")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.tarballs:   # in any order: each is matched to its pin by name, then must be the pinned one
                given = {path.name.rsplit("-", 1)[0]: path for path in args.tarballs}
                missing = [pin.spec for pin in PINS if pin.name not in given]
                if missing:
                    raise PinError(f"no tarball named like {', '.join(missing)} (npm pack names them NAME-VERSION.tgz)")
                tarballs = [given[pin.name] for pin in PINS]
            else:
                tarballs = [npm_pack(pin.spec, Path(tmp)) for pin in PINS]
            libraries = [(pin, *verified(pin, path.read_bytes())) for pin, path in zip(PINS, tarballs)]
    except PinError as err:
        print(f"error: {err}; nothing written", file=sys.stderr)
        return 1
    write(libraries)
    problems = check(TEMPLATE.read_text(encoding="utf-8"), licence_files())
    assert not problems, problems
    print(f"wrote {TEMPLATE} ({TEMPLATE.stat().st_size} bytes) and {len(libraries)} licences in {LICENCES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
