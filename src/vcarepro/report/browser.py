"""Read the report in a real browser: Chromium driven by Selenium, at the widths a researcher reads it.

``python -m vcarepro.report.browser reports/index.html [--shots DIR]`` opens the page offline (every host
name resolves to nothing) at 1400 px and 800 px and checks what a reader would notice: the summary is
the first section, no table is wider than the text column, the page does not scroll sideways, no badge
wraps, every image loads, the page logs no error and requests nothing but itself and its data: URIs.
It prints one line per problem and exits 1 if there is any (2 if Chromium or its driver is missing).
Screenshots of the whole page at each width go to ``--shots``: ``report_<width>.png`` from the top and, where the
page is taller than Chromium draws in one image (16,384 px), the rest in parts ``report_<width>_2.png``, ...
The test suite runs the same checks (tests/test_report_browser.py), and ``.ci/run`` runs them on the fresh
clone's own report.

Needs Selenium (the ``test`` extra) and Debian's ``chromium`` and ``chromium-driver``; Selenium's own
driver download is never used (``SE_OFFLINE``): the driver is the one beside the browser.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from vcarepro.core.io import write_bytes

WIDTHS = (1400, 800)
HEIGHT = 1000
MAX_SHOT_HEIGHT = 16384  # Chromium's largest texture: a taller page is shot in parts of at most this height
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]  # nothing on the page may need the network

# What the page says about itself at one width, measured in the page (one round trip).
MEASURE = """
const main = document.querySelector('main') || document.body;
const column = main.clientWidth;
const heading = e => { let n = e;
                       while (n && !/^H[1-3]$/.test(n.tagName)) { n = n.previousElementSibling || n.parentElement; }
                       return n ? n.textContent.trim().slice(0, 60) : '(top)'; };
const firstSection = document.querySelector('main h2');
return {
  column: column,
  page: [document.documentElement.scrollWidth, window.innerWidth],
  first_h2: firstSection ? firstSection.textContent.trim() : null,
  first_h2_in_summary: !!(firstSection && firstSection.closest('#summary')),
  tables: [...document.querySelectorAll('table')].map(t => ({
      near: heading(t), width: Math.ceil(t.getBoundingClientRect().width), scroll: t.scrollWidth,
      visible: t.getClientRects().length > 0})),
  badges: [...document.querySelectorAll('.scale, .unv, .src')].filter(b => b.getClientRects().length > 1)
      .map(b => b.textContent + ' near ' + heading(b)),
  images: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
  n_images: document.images.length,
  height: document.documentElement.scrollHeight,
};
"""


class BrowserMissing(RuntimeError):
    """Chromium or chromedriver is not installed."""


def find_browser() -> tuple:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        raise BrowserMissing(
            "chromium and chromedriver are needed (Debian: apt-get install chromium chromium-driver; "
            ".ci/run installs them)."
        )
    return browser, driver


def open_browser():
    """A headless Chromium under Selenium, with its performance (network) and console logs kept."""
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    browser, driver = find_browser()
    options = Options()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    # a profile of our own, removed at quit: the one Chromium makes itself stays in TMPDIR after every run
    profile = tempfile.mkdtemp(prefix="vcarepro-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    try:
        chrome = webdriver.Chrome(service=Service(driver), options=options)
    except BaseException:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    quit_only = chrome.quit

    def quit() -> None:
        try:
            quit_only()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    chrome.quit = quit
    return chrome


def requests_made(driver) -> List[str]:
    """Every URL the page asked for since the last call (from Chromium's DevTools network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def shot_names(width: int, parts: int) -> List[str]:
    """The files of a page shot in ``parts`` parts, top first: ``report_<width>.png`` (what a crop of the first screen
    opens), then ``report_<width>_2.png``, ...; numbers padded so that the names sort in page order."""
    digits = len(str(parts))
    return [f"report_{width}.png"] + [f"report_{width}_{k:0{digits}d}.png" for k in range(2, parts + 1)]


def save_shots(driver, width: int, height: int, shots: Path) -> List[Dict[str, Any]]:
    """The whole page, ``height`` px tall at ``width``, as PNGs of at most ``MAX_SHOT_HEIGHT`` px each, top to bottom
    (one clip of the page per part: a single screenshot stops at Chromium's limit). [{"file", "top", "bottom"}]."""
    shots.mkdir(parents=True, exist_ok=True)
    for old in shots.glob(f"report_{width}_*.png"):  # parts of a taller page shot here before would read as this one's
        if old.stem.rpartition("_")[2].isdigit():
            old.unlink()
    tops = list(range(0, max(height, 1), MAX_SHOT_HEIGHT))
    written = []
    for name, top in zip(shot_names(width, len(tops)), tops):
        bottom = min(top + MAX_SHOT_HEIGHT, max(height, 1))
        image = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": top, "width": width, "height": bottom - top, "scale": 1},
            },
        )
        write_bytes(shots / name, base64.b64decode(image["data"]))
        written.append({"file": str(shots / name), "top": top, "bottom": bottom})
    return written


def check_page(page: Path, widths: Sequence[int] = WIDTHS, shots: Optional[Path] = None, driver=None) -> Dict[str, Any]:
    """{"problems": [one line each], "widths": {width: what was measured}} for the page at each width."""
    page = Path(page).resolve()
    own = driver is None
    driver = driver or open_browser()
    problems: List[str] = []
    measured: Dict[int, Any] = {}
    try:
        for width in widths:
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
            )
            driver.get_log("performance")  # drop what earlier widths logged
            driver.get(page.as_uri())
            found = driver.execute_script(MEASURE)
            found["requests"] = requests_made(driver)
            found["console"] = [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            measured[width] = found
            at = f"at {width} px"
            if found["first_h2"] is None or not found["first_h2_in_summary"]:
                problems.append(f"{at}: the first section is {found['first_h2']!r}, not the summary")
            for t in found["tables"]:
                if t["visible"] and max(t["width"], t["scroll"]) > found["column"] + 1:
                    problems.append(
                        f"{at}: a table under {t['near']!r} is {max(t['width'], t['scroll'])} px wide in "
                        f"a {found['column']} px column"
                    )
            if found["page"][0] > found["page"][1]:
                problems.append(
                    f"{at}: the page scrolls sideways ({found['page'][0]} px in a {found['page'][1]} px window)"
                )
            problems += [f"{at}: a badge wraps: {b}" for b in found["badges"]]
            problems += [f"{at}: an image did not load: {alt}" for alt in found["images"]]
            problems += [
                f"{at}: the page requested {url}"
                for url in found["requests"]
                if not url.startswith(("data:", page.as_uri()))
            ]
            problems += [f"{at}: the console says {line}" for line in found["console"]]
            if shots is not None:
                found["shots"] = save_shots(driver, width, found["height"], shots)
    finally:
        if own:
            driver.quit()
    return {"problems": problems, "widths": measured}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path, nargs="?", default=Path("reports/index.html"))
    parser.add_argument(
        "--shots",
        type=Path,
        default=None,
        help="write the whole page at each width here: report_<width>.png, then report_<width>_2.png, ... where it "
        "is taller than 16,384 px",
    )
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(
            f"error: {args.page} does not exist; run `dvc repro` first (it writes reports/index.html).", file=sys.stderr
        )
        return 2
    try:
        result = check_page(args.page, shots=args.shots)
    except BrowserMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for width, found in result["widths"].items():
        print(
            f"{width} px: {len(found['tables'])} tables in a {found['column']} px column, {found['n_images']} images, "
            f"{len(found['requests'])} requests, first section {found['first_h2']!r}"
        )
        if "shots" in found:
            parts = ", ".join(f"{Path(s['file']).name} ({s['top']}-{s['bottom']} px)" for s in found["shots"])
            print(f"{width} px: the whole page, {found['height']} px tall, in {len(found['shots'])} PNG(s): {parts}")
    for line in result["problems"]:
        print(line)
    print("browser check: " + ("ok" if not result["problems"] else f"{len(result['problems'])} problem(s)"))
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
