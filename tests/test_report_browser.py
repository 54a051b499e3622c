"""The report read in a real browser (Chromium under Selenium) at 1400 and 800 px, offline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import ROOT, add_vca_and_baseline, project, vouch, write_seeds  # noqa: F401  (project: fixtures)
from vcarepro.report.browser import check_page
from vcarepro.report.render import render_report

pytestmark = pytest.mark.slow


def test_the_report_fits_both_widths_opens_offline_and_answers_first(project, driver):
    add_vca_and_baseline(project)
    write_seeds(project, "cls", "deit_tiny-vca-stage1_only", "top1", [70.0, 71.0])  # a Table 3 row with a conflict
    for run, seeds in (("dit_s2-mhsa", [30.0, 31.0, 32.0]), ("dit_s2-vca", [29.0, 30.0, 31.5])):
        write_seeds(project, "gen", run, "fid", seeds)
    samples = project / "runs" / "gen" / "dit_s2-vca" / "samples"
    samples.mkdir(parents=True)
    from PIL import Image

    Image.new("L", (73, 91), 128).save(samples / "grid_seed_0.png")
    vouch(project, "gen", "dit_s2-vca")
    page = render_report(project, project / "reports" / "index.html")
    html = page.read_text()
    shots = ROOT / "test-artifacts"  # screenshots for people, kept as test artefacts
    result = check_page(page, shots=shots, driver=driver)
    assert result["problems"] == []
    for width, found in result["widths"].items():
        assert found["first_h2"] == "Summary: what reproduced"
        assert len(found["tables"]) == html.count("<table") >= 15
        assert found["n_images"] == html.count("<img ") >= 4  # curves, gains, cost, samples
        assert found["requests"] and all(u.startswith(("data:", page.as_uri())) for u in found["requests"])
        assert found["column"] <= width
    assert result["widths"][800]["column"] < 800 < result["widths"][1400]["column"] + 400
    assert (shots / "report_1400.png").stat().st_size > 10_000 and (shots / "report_800.png").stat().st_size > 10_000


def band(i):
    """The colour of the i-th 1000 px band of TALL: each differs from its neighbours."""
    return ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)


# 40,000 px of 1000 px bands, over twice what Chromium draws in one image
TALL = "<!DOCTYPE html><html><body style='margin:0'><main>{}</main></body></html>"


def test_shots_of_a_page_taller_than_chromium_draws_cover_it_in_parts_in_order(tmp_path, driver, capsys):
    from PIL import Image

    from vcarepro.report.browser import MAX_SHOT_HEIGHT, main

    page = tmp_path / "index.html"
    page.write_text(
        TALL.format("".join(f'<div style="height:1000px;background:rgb{band(i)}"></div>' for i in range(40)))
    )
    shots = tmp_path / "shots"
    shots.mkdir()
    (shots / "report_800_4.png").write_bytes(b"a part of a taller page shot here before")
    found = check_page(page, widths=(800,), shots=shots, driver=driver)["widths"][800]
    height = found["height"]
    assert height > 2 * MAX_SHOT_HEIGHT
    parts = found["shots"]
    assert [Path(s["file"]).name for s in parts] == ["report_800.png", "report_800_2.png", "report_800_3.png"]
    assert sorted(p.name for p in shots.iterdir()) == [Path(s["file"]).name for s in parts]  # the stale part is gone
    assert parts[0]["top"] == 0 and parts[-1]["bottom"] == height
    assert all(a["bottom"] == b["top"] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
    for s in parts:
        image = Image.open(s["file"]).convert("RGB")
        assert image.size == (800, s["bottom"] - s["top"]) and image.size[1] <= MAX_SHOT_HEIGHT
        # each part holds its own span of the page: its first and last rows are the bands there
        assert image.getpixel((400, 0)) == band(s["top"] // 1000)
        assert image.getpixel((400, image.size[1] - 1)) == band((s["bottom"] - 1) // 1000)
    # the command says where each part sits (and fails the page: it has no summary)
    assert main([str(page), "--shots", str(shots)]) == 1
    out = capsys.readouterr().out
    assert f"800 px: the whole page, {height} px tall, in 3 PNG(s): report_800.png (0-16384 px), " in out
    assert f"report_800_3.png (32768-{height} px)" in out


BROKEN = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><main>
<h2>Calibration</h2><section id="summary"><h2>Summary</h2></section>
<table><tr><td style="white-space:nowrap">{wide}</td></tr></table>
<p style="width:120px">a <span class="scale">badge with several words in it</span> that wraps</p>
<img alt="remote" src="http://cdn.example.invalid/vega.png">
<script>console.error("boom")</script>
</main></body></html>"""


def test_the_browser_check_names_each_problem_a_reader_would_hit(tmp_path, driver):
    page = tmp_path / "index.html"
    page.write_text(BROKEN.format(wide="x" * 400))
    problems = check_page(page, driver=driver)["problems"]
    for width in (1400, 800):
        at = [p for p in problems if p.startswith(f"at {width} px")]
        assert any("the first section is 'Calibration', not the summary" in p for p in at), at
        assert any("a table under 'Calibration' is" in p for p in at), at
        assert any("a badge wraps: badge with several words in it" in p for p in at), at
        assert any("an image did not load: remote" in p for p in at), at
        assert any("requested http://cdn.example.invalid/vega.png" in p for p in at), at
        assert any("the console says" in p and "boom" in p for p in at), at
    assert any("scrolls sideways" in p for p in problems)


def test_the_command_line_check_says_ok_or_names_the_missing_page(tmp_path, project, driver, capsys):
    from vcarepro.report.browser import main

    assert main([str(tmp_path / "nowhere.html")]) == 2
    assert "does not exist; run `dvc repro` first" in capsys.readouterr().err
    page = render_report(project, project / "reports" / "index.html")
    assert main([str(page)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("browser check: ok") and "800 px:" in out


def test_the_command_leaves_nothing_in_tmpdir(tmp_path, monkeypatch, driver):
    """`python -m vcarepro.report.browser` keeps no Chromium profile (``driver``: skipped, or required, alike)."""
    import tempfile

    from vcarepro.report.browser import main

    page = tmp_path / "index.html"
    page.write_text(BROKEN.format(wide="x"))
    # short: Chromium's singleton socket under a pytest tmp_path would pass the 108-byte limit of a socket path
    scratch = Path(tempfile.mkdtemp(prefix="vcb-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    try:
        assert main([str(page)]) == 1  # that page's problems, found
        assert list(scratch.iterdir()) == []
    finally:
        shutil.rmtree(scratch)
