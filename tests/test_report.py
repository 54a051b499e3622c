"""The report: paper beside ours, verdicts that never judge across scales, escaped, offline."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from vcarepro.config import compose
from vcarepro.report.reference import PaperValue, load_reference, paper_value
from vcarepro.report.render import render_report
from vcarepro.report.tables import (BETTER, DIFFERS, MATCHES, NO_PAPER_VALUE, NOT_COMPARABLE, NOT_RUN, REPRODUCED,
                                    SHORT, Measured, exact_verdict, verdict)

ROOT = Path(__file__).resolve().parents[1]


def ours(mean, n=1):
    return Measured(mean, 0.0, n, "paper")


@pytest.mark.parametrize("paper, mine, lower, expected", [
    (75.6, 75.4, False, REPRODUCED),
    (75.6, 76.5, False, BETTER),
    (75.6, 74.0, False, SHORT),
    (62.3, 60.0, True, BETTER),
    (62.3, 65.0, True, SHORT),
])
def test_verdicts_at_paper_scale(paper, mine, lower, expected):
    assert verdict(PaperValue(paper, "S"), ours(mine), comparable=True, tolerance=0.5, lower_is_better=lower) == expected


def test_a_smoke_scale_number_is_never_judged():
    assert verdict(PaperValue(75.6, "A"), ours(99.0), comparable=False, tolerance=0.5,
                   lower_is_better=False) == NOT_COMPARABLE
    assert verdict(PaperValue(75.6, "A"), None, comparable=True, tolerance=0.5, lower_is_better=False) == NOT_RUN
    assert verdict(PaperValue(None, None), ours(1.0), comparable=True, tolerance=0.5,
                   lower_is_better=True) == NO_PAPER_VALUE


def test_exact_quantities_compare_at_the_papers_precision():
    assert exact_verdict(PaperValue(6.0, "N"), 5.974) == MATCHES
    assert exact_verdict(PaperValue(11.6, "N"), 13.2) == DIFFERS


def test_reference_data_is_valid_and_holds_the_conflict():
    ref = load_reference(ROOT / "data" / "paper_reference.yaml")
    rows = {r["variant"]: r for r in ref["table3"]["rows"]}
    assert rows["VCA in Stage I only"]["top1"] == [75.5, "S"]
    assert rows["VCA in Stage I only"]["conflict"]["top1"] == [75.4, "N"]
    with pytest.raises(ValueError, match="source 'X' is not one of"):
        paper_value([1.0, "X"], ref["sources"])
    with pytest.raises(ValueError, match="both a value and a source"):
        paper_value([1.0, None], ref["sources"])


@pytest.fixture
def project(tmp_path):
    """A project tree with embedded params, a few run results and one hostile run name."""
    for rel in ("conf", "data/paper_reference.yaml"):
        src = ROOT / rel
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / rel)
    params = compose([])
    params["cls_runs"]["<script>alert(1)</script>"] = {"model": "deit_tiny-mhsa", "seeds": [0]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "complexity.json").write_text(json.dumps({
        "deit_tiny-mhsa": {"params_m": 5.717, "gmacs": 1.254}, "deit_tiny-vca": {"params_m": 5.974, "gmacs": 1.257}}))
    run = tmp_path / "runs" / "cls" / "deit_tiny-vca"
    (run / "live" / "plots" / "metrics" / "seed_0" / "train").mkdir(parents=True)
    (run / "live" / "plots" / "metrics" / "seed_0" / "train" / "loss.tsv").write_text(
        "timestamp\tstep\tloss\n0\t1\t2.0\n0\t2\t1.5\n")
    (run / "metrics.json").write_text(json.dumps(
        {"top1": 88.25, "top1_std": 1.5, "top1_seed0": 87.2, "top1_seed1": 89.3, "n_seeds": 2, "top5": 99.0,
         "top5_std": 0.1, "loss": 0.4, "loss_std": 0.01}))
    return tmp_path


def test_report_shows_paper_beside_ours_without_judging_embedded_numbers(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "Embedded scale: no number below is comparable with the paper" in html
    assert "88.2 ± 1.5 (n=2)" in html  # ours, mean ± std over two seeds
    assert "75.6" in html and "[A]" in html  # the paper's DeiT-T +VCA value with its source
    row = html[html.index("<td>DeiT-T</td><td>VCA</td>"):]
    row = row[:row.index("</tr>")]
    assert NOT_COMPARABLE in row and REPRODUCED not in row and SHORT not in row
    assert "-1.0" not in row and "+0.0" not in row.split(NOT_COMPARABLE)[0]  # no difference for smoke numbers
    assert MATCHES in row  # 5.974M params at paper shape vs the paper's 6.0M
    assert html.count(NOT_RUN) >= 5  # DeiT-S, PVT, Swin, CSwin, generation rows...
    assert "paper value not available" in html  # DiT-S/8 has no known paper value
    assert "other summary: 75.4" in html  # the Table 3 conflict is shown
    contrast = compose([])["cls_shape"]["contrast_tokens"]
    assert f"contrast_tokens={contrast}, stage2=diff" in html  # the options the run used, not the paper shape's


def test_report_escapes_names_and_works_offline(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert not re.search(r"""(src|href)=["']https?://""", html)  # nothing loads from the network
    assert "data:image/png;base64," in html  # the loss curve is embedded


def test_report_lists_the_knobs_that_differ_from_the_papers_recipe(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    epochs = compose([])["cls_recipe"]["epochs"]
    assert f"<code>cls_recipe.epochs</code></td><td>{epochs}</td><td>300</td>" in html
    assert "<code>prepare_cls.source</code></td><td>digits</td><td>imagenet</td>" in html
    assert "<code>cls_shape.depth</code></td><td>3</td><td>the model&#39;s own</td>" in html
