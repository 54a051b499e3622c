"""`dvc plots show` draws its charts offline: .dvc/config names plots/offline.html as DVC's page template, and that page
carries Vega, Vega-Lite and Vega-Embed inline (pinned from npm by plots/update_template.py), not DVC's CDN tags.

The fast tests read the committed page, config and README; the slow ones run the real `dvc plots show` in a tiny
project and open its page in Chromium with every host name unresolvable (vcarepro.report.browser.open_browser).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers import ROOT

PLOTS = ROOT / "plots"
TEMPLATE = PLOTS / "offline.html"


def _load_updater():
    spec = importlib.util.spec_from_file_location("plots_update_template", PLOTS / "update_template.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


updater = _load_updater()


# -- the committed page, config and README (fast) -------------------------------------------------------------------


def test_the_template_inlines_the_pinned_libraries_and_has_no_place_for_dvcs_cdn_scripts():
    page = TEMPLATE.read_text(encoding="utf-8")
    assert "{scripts}" not in page
    assert page.count("{plot_divs}") == 1 and page.count("{refresh_tag}") == 1
    assert "cdn.jsdelivr.net" not in page and not re.search(r"<script[^>]*\bsrc=\"(?!data:)", page)
    found = updater.inlined(page)
    assert [spec for spec, _, _ in found] == ["vega@5.20.2", "vega-lite@5.2.0", "vega-embed@6.18.2"]
    for pin, (_, _, js) in zip(updater.PINS, found):
        assert hashlib.sha256(js.encode("utf-8")).hexdigest() == pin.sha256, pin.spec
    # byte for byte what the script writes from those texts, and each licence is the package's own
    assert updater.check(page, updater.licence_files()) == []
    assert sorted(p.name for p in (PLOTS / "licences").iterdir()) == sorted(f"{p.name}-LICENSE" for p in updater.PINS)


def test_dvc_render_fills_the_template_without_touching_the_libraries_or_adding_its_cdn_tags():
    from dvc_render.html import HTML
    from dvc_render.vega import VegaRenderer

    page = TEMPLATE.read_text(encoding="utf-8")
    document = HTML(page, refresh_seconds=5)  # raises if {plot_divs} were missing
    document.with_scripts(VegaRenderer.SCRIPTS)
    document.with_element('<div id="plot-1">chart</div>')
    filled = document.embed()
    assert "cdn.jsdelivr.net" not in filled and '<div id="plot-1">chart</div>' in filled
    assert '<meta http-equiv="refresh" content="5">' in filled
    assert [js for _, _, js in updater.inlined(filled)] == [js for _, _, js in updater.inlined(page)]


def test_the_dvc_config_names_the_template_relative_to_the_dvc_directory():
    import configobj

    config = configobj.ConfigObj(str(ROOT / ".dvc" / "config"))
    # dvc/commands/plots.py: a relative plots.html_template is joined to the .dvc/ directory
    assert (ROOT / ".dvc" / config["plots"]["html_template"]).resolve() == TEMPLATE
    assert config["core"]["analytics"] == "false" and config["core"]["check_update"] == "false"
    assert config["hydra"]["enabled"] == "true"


def test_the_pins_are_the_major_versions_dvc_render_would_load_from_the_cdn():
    """DVC writes its specs for the Vega majors it loads; a newer dvc-render within them still draws with ours."""
    from dvc_render.vega import VegaRenderer

    cdn = dict(re.findall(r"cdn\.jsdelivr\.net/npm/([a-z-]+)@([0-9.]+)", VegaRenderer.SCRIPTS))
    major = lambda version: version.split(".")[0]  # noqa: E731
    assert {k: major(v) for k, v in cdn.items()} == {pin.name: major(pin.version) for pin in updater.PINS}, (
        f"dvc_render now loads {cdn}, other Vega majors; update the pins (plots/README.md says how)"
    )


def test_the_readme_states_each_pin():
    readme = (PLOTS / "README.md").read_text(encoding="utf-8")
    for pin in updater.PINS:
        for fact in (f"{pin.name}@{pin.version}", pin.integrity, pin.sha256):
            assert fact in readme, f"plots/README.md does not state {fact}"


def test_the_check_names_a_hand_edited_page_or_a_wrong_licence():
    page = TEMPLATE.read_text(encoding="utf-8")
    licences = updater.licence_files()
    vega = updater.PINS[0]
    start = page.index(f'data-package="{vega.spec}"')
    one_char = page[: start + 500] + ("X" if page[start + 500] != "X" else "Y") + page[start + 501 :]
    assert any("vega@5.20.2: the inlined text has sha256" in p for p in updater.check(one_char, licences))
    retitled = page.replace("<title>DVC Plot</title>", "<title>Plots</title>")
    assert any("differs from what plots/update_template.py writes" in p for p in updater.check(retitled, licences))
    with_cdn = page.replace("{refresh_tag}", "{refresh_tag}\n    {scripts}")
    assert any("{scripts} 1 times, not 0" in p for p in updater.check(with_cdn, licences))
    swapped = dict(licences, vega=licences["vega-lite"])
    assert updater.check(page, swapped) == ["plots/licences/vega-LICENSE is missing or not vega@5.20.2's LICENSE"]


def test_a_library_holding_a_dvc_placeholder_or_a_script_end_goes_in_as_a_data_uri():
    from dvc_render.html import HTML

    awkward = 'var a="{scripts}",b="{plot_divs}",c="</script><!--";'
    pin = updater.Pin("x", "1.0.0", "", "build/x.min.js", hashlib.sha256(awkward.encode()).hexdigest(), "")
    page = updater.render(
        [(pin, awkward), (updater.PINS[0]._replace(sha256=hashlib.sha256(b"plain").hexdigest()), "plain")]
    )
    tag = updater.script_tag(pin, awkward)
    assert 'src="data:text/javascript;base64,' in tag and "{scripts}" not in tag and "</script><!--" not in tag
    assert "{scripts}" not in page and page.count("{plot_divs}") == 1
    filled = HTML(page).with_element("<div>chart</div>").embed()
    assert [(spec, js) for spec, _, js in updater.inlined(filled)] == [("x@1.0.0", awkward), ("vega@5.20.2", "plain")]


def _tarball(files: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused():
    vega = updater.PINS[0]
    fake = _tarball({"build/vega.min.js": b"window.vega={}", "LICENSE": b"BSD"})
    with pytest.raises(updater.PinError, match="integrity is sha512-.*not the pinned sha512-qmH7"):
        updater.verified(vega, fake)
    trusted = vega._replace(integrity="sha512-" + base64.b64encode(hashlib.sha512(fake).digest()).decode())
    with pytest.raises(updater.PinError, match="build/vega.min.js has sha256 .* not the pinned 4794d016"):
        updater.verified(trusted, fake)


# -- the real `dvc plots show`, read in Chromium offline (slow) -----------------------------------------------------

# Each chart vega-embed drew: its canvas's size, how many pixels are not background (axes, labels, marks) and how
# many are coloured (marks: DVC's lines, points and cells are coloured; axes, grid lines and text are grey).
DRAWN = """
return [...document.querySelectorAll('.vega-embed')].map(el => {
  const canvas = el.querySelector('canvas');
  if (!canvas || !canvas.width || !canvas.height) return {id: el.id, size: [0, 0], inked: 0, coloured: 0};
  const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0, coloured = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] === 0) continue;
    if (!(d[i] > 245 && d[i + 1] > 245 && d[i + 2] > 245)) inked++;
    if (Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 40) coloured++;
  }
  return {id: el.id, size: [canvas.width, canvas.height], inked: inked, coloured: coloured};
});
"""
CHARTS = 3  # the plots dvc.yaml declares below
MIN_INK = 2000  # pixels: axes, labels and marks; an empty canvas has none
MIN_MARKS = 150  # coloured pixels: the loss chart's two lines, the scatter's twelve circles, the confusion cells


def _dvc(*args: str, cwd: Path) -> str:
    dvc = Path(sys.executable).with_name("dvc")
    command = [str(dvc) if dvc.exists() else shutil.which("dvc"), *args]
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


PLOTS_YAML = """plots:
  - loss:
      x: step
      y:
        logs/train.csv: [train_loss, val_loss]
  - loss_vs_val:
      template: scatter
      x: train_loss
      y:
        logs/train.csv: val_loss
  - logs/confusion.json:
      template: confusion
      x: actual
      y: predicted
"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{"offline": the page `dvc plots show` writes with this checkout's template setting,
    "default": the page it writes with DVC's own template} in a tiny project."""
    import configobj

    project = tmp_path_factory.mktemp("plots") / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    _dvc("init", "-q", cwd=project)
    shutil.copytree(PLOTS, project / "plots", ignore=shutil.ignore_patterns("__pycache__"))
    setting = configobj.ConfigObj(str(ROOT / ".dvc" / "config"))["plots"]["html_template"]  # ../plots/offline.html
    config = project / ".dvc" / "config"
    bare = config.read_text()
    (project / "logs").mkdir()
    (project / "logs" / "train.csv").write_text(
        "step,train_loss,val_loss\n"
        + "".join(f"{step},{2.0 / (step + 1):.4f},{2.4 / (step + 1) + 0.1:.4f}\n" for step in range(12))
    )
    labels = ["cat", "dog", "bird"]
    (project / "logs" / "confusion.json").write_text(
        "["
        + ",".join(
            f'{{"actual": "{labels[i % 3]}", "predicted": "{labels[(i + (i % 4 == 0)) % 3]}"}}' for i in range(30)
        )
        + "]"
    )
    (project / "dvc.yaml").write_text(PLOTS_YAML)
    config.write_text(bare + f"[plots]\n    html_template = {setting}\n")
    out = _dvc("plots", "show", cwd=project)
    assert out.strip().endswith("dvc_plots/index.html")
    config.write_text(bare)
    _dvc("plots", "show", "-o", "default_plots", cwd=project)
    return {"offline": project / "dvc_plots" / "index.html", "default": project / "default_plots" / "index.html"}


def _open(driver, page: Path, wait_s: float, charts: int = CHARTS):
    """What was drawn, the URLs requested and the console's warnings and errors, once ``charts`` charts have ink
    (or after ``wait_s`` seconds)."""
    from vcarepro.report.browser import requests_made

    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    )
    driver.get_log("performance")
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(page.as_uri())
    deadline = time.monotonic() + wait_s
    while True:
        drawn = driver.execute_script(DRAWN)
        done = sum(c["inked"] >= MIN_INK and c["coloured"] >= MIN_MARKS for c in drawn)
        if done >= charts or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    console = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    return drawn, requests_made(driver), console


@pytest.mark.slow
def test_dvc_plots_show_draws_every_chart_offline_with_the_projects_template(driver, pages):
    html = pages["offline"].read_text(encoding="utf-8")
    assert html.count("vegaEmbed('#") == CHARTS and "cdn.jsdelivr.net" not in html
    drawn, requests, console = _open(driver, pages["offline"], wait_s=30)
    assert len(drawn) == CHARTS, drawn
    assert [c["id"] for c in drawn] == ["loss", "loss_vs_val", "logs_confusion_json"]
    for chart in drawn:
        assert chart["size"][0] >= 200 and chart["size"][1] >= 200, chart
        assert chart["inked"] >= MIN_INK and chart["coloured"] >= MIN_MARKS, chart
    # no errors; the warnings are Vega's and vega-embed's own about DVC's specs, the same as on DVC's online page
    # (e.g. "Dropping {} from channel", "The input spec uses Vega-Lite v5, but the current version ... is v5.2.0")
    assert [e for e in console if e["level"] == "SEVERE" or e["source"] != "console-api"] == [], console
    assert requests and all(url.startswith(("file:", "data:")) for url in requests), requests
    shots = ROOT / "test-artifacts"  # a screenshot for people, kept as a test artefact (not watched, not tracked)
    shots.mkdir(exist_ok=True)
    driver.save_screenshot(str(shots / "dvc_plots_offline.png"))


@pytest.mark.slow
def test_dvcs_default_template_draws_no_chart_offline(driver, pages):
    html = pages["default"].read_text(encoding="utf-8")
    assert html.count("vegaEmbed('#") == CHARTS and "https://cdn.jsdelivr.net/npm/vega@5.20.2" in html
    drawn, requests, console = _open(driver, pages["default"], wait_s=1)
    assert [c for c in drawn if c["inked"] > 0] == []  # vegaEmbed never ran: no container, no canvas
    assert any(url.startswith("https://cdn.jsdelivr.net/npm/vega") for url in requests), requests
    assert any("vegaEmbed is not defined" in e["message"] for e in console), console
