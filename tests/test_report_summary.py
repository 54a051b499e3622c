"""The report answers first: a summary of every claim with one status, one read-out, honest marks and intervals."""

from __future__ import annotations

import csv
import json
import re

import yaml

from helpers import add_vca_and_baseline, project, vouch, write_seeds  # noqa: F401  (project: fixtures)
from vcarepro.params.config import compose
from vcarepro.report.figures import gains_png
from vcarepro.report.render import render_report
from vcarepro.report.summary import (
    NOT_RESOLVED,
    NOT_RUN,
    NOT_TESTABLE,
    REPRODUCED,
    SAME_DIRECTION,
    STATUSES,
    combine,
    status_key,
)


def summary_rows(project):
    with open(project / "reports" / "tables" / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_summary_is_the_first_section_and_holds_one_row_per_claim(project):
    add_vca_and_baseline(project)
    for run, seeds in (
        ("dit_s2-mhsa", [30.0, 31.0]),
        ("dit_s2-vca", [29.0, 30.5]),
        ("sit_s2-mhsa", [28.0, 29.0]),
        ("sit_s2-vca", [27.5, 28.0]),
    ):
        write_seeds(project, "gen", run, "fid", seeds)
    html = render_report(project, project / "reports" / "index.html").read_text()
    headings = re.findall(r"<h2[^>]*>(.*?)</h2>", html)
    assert headings[0] == "Summary: what reproduced"
    rows = summary_rows(project)
    claims = [r["claim"] for r in rows]
    # every abstract claim, each backbone of Table 1 and each Table 2 pair with a paper value, Tables 3 and 4
    for text in (
        "VCA adds fewer than 0.3M parameters to DeiT-T",
        "VCA adds no FLOPs",
        "complexity O(N n C) with n << N",
        "VCA lifts DeiT-T from 72.2 to 75.6 top-1",
        "VCA lowers FID-50K by 2.1 to 5.2 across DiT and SiT",
        "DeiT-T: VCA minus baseline, top-1",
        "CSwin-T: VCA minus baseline, top-1",
        "DiT-S/2: VCA minus baseline, FID",
        "SiT-B/2: VCA minus baseline, FID",
    ):
        assert text in claims, text
    assert sum(c.startswith(("Stage ablation", "Contrast-token generation")) for c in claims) == 4
    assert "DiT-S/8: VCA minus baseline, FID" not in claims  # no paper value and not run: not a claim
    # one status per row, from the fixed vocabulary, each defined once on the page
    assert {status_key(r["status"]) for r in rows} <= set(STATUSES)
    legend = html[
        html.index("<strong>Statuses</strong>") : html.index("</ul>", html.index("<strong>Statuses</strong>"))
    ]
    for status in STATUSES:
        assert legend.count(f">{status}</span>") == 1, status
    by_claim = {r["claim"]: r for r in rows}
    # compute claims keep their tolerance in words; they are measured at the paper's shape at every scale
    flops = by_claim["VCA adds no FLOPs"]
    assert flops["status"] == REPRODUCED and "equal at one decimal" in flops["note"] and flops["scale"] == "paper shape"
    # the embedded DeiT-T gain resolves (+28.25 [+14.81, +41.69]) but its size is not comparable
    deit = by_claim["DeiT-T: VCA minus baseline, top-1"]
    assert deit["status"] == SAME_DIRECTION and deit["paper"] == "+3.4" and deit["scale"] == "embedded"
    assert deit["ours"].startswith("+28.25 [+14.81, +41.69]")
    # backbones not in this scale's matrix: not run, with the command that runs them
    pvt = by_claim["PVT-T: VCA minus baseline, top-1"]
    assert pvt["status"] == NOT_RUN and "scale=paper" in pvt["command"]
    # a claim over several rows: the weakest measured one, and how many were measured
    fid = by_claim["VCA lowers FID-50K by 2.1 to 5.2 across DiT and SiT"]
    assert fid["status"] == "not resolved with 2 seeds" and fid["source"] == "A"
    assert fid["ours"].startswith("DiT-S/2: -0.75 [") and "; SiT-S/2: -0.75 [" in fid["ours"]  # each its interval
    assert "2 of 12 rows measured" in fid["note"]
    # the command runs what was not run: the runs of this scale were, so only the paper scale's is named (a branch
    # of its own: README, Scales), and it ends in the `dvc repro` that runs them
    assert fid["command"] == (
        "at paper scale: git switch -c paper && python -m vcarepro.params.config scale=paper "
        "prepare_cls.imagenet_root=/path/to/imagenet && dvc repro"
    )
    summary = html[html.index('<table id="summary-table">') : html.index("</table>")]
    assert (
        "to run: at paper scale, <code>git switch -c paper &amp;&amp; python -m vcarepro.params.config scale=paper "
        "prepare_cls.imagenet_root=/path/to/imagenet &amp;&amp; dvc repro</code>"
    ) in summary


def test_a_claim_over_several_rows_takes_its_weakest_measured_row():
    assert combine([SAME_DIRECTION, NOT_RUN, REPRODUCED]) == SAME_DIRECTION
    assert combine([SAME_DIRECTION, NOT_RESOLVED.format(n=3)]) == "not resolved with 3 seeds"
    assert combine([SAME_DIRECTION, "opposite direction", NOT_RESOLVED.format(n=3)]) == "opposite direction"
    assert combine([NOT_RUN, NOT_TESTABLE]) == NOT_RUN and combine([NOT_TESTABLE]) == NOT_TESTABLE


def test_one_read_out_at_embedded_scale_and_the_sources_at_paper_scale(project):
    # embedded: VCA's best epoch (90.5) is never used; the cell, the gain and its interval are final-epoch numbers
    add_vca_and_baseline(project)
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "the final epoch&#39;s weights, for every run, cell, difference and interval" in html
    assert "90.5" not in html and "+28.25 [+14.81, +41.69]" in html
    gains = json.loads((project / "reports" / "results.json").read_text())["gains"]
    deit = next(g for g in gains if g["model"] == "DeiT-T")
    assert deit["ours_value"] == 88.25 - 60.0
    # paper scale: each row is read as its source reports it, the difference too (VCA best epoch minus DeiT final)
    params = compose(["scale=paper"])
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    for run, top1, best in (
        ("deit_tiny-mhsa", [72.0, 72.4], [72.5, 72.9]),
        ("deit_tiny-vca", [75.0, 75.2], [75.5, 75.9]),
    ):
        path = project / "runs" / "cls" / run
        path.mkdir(parents=True, exist_ok=True)
        (path / "metrics.json").write_text(
            json.dumps(
                {
                    "top1": sum(top1) / 2,
                    "top1_std": 0.28,
                    "n_seeds": 2,
                    "top1_best": sum(best) / 2,
                    "top1_best_std": 0.28,
                    **{f"top1_seed{i}": v for i, v in enumerate(top1)},
                    **{f"top1_best_seed{i}": v for i, v in enumerate(best)},
                }
            )
        )
        vouch(project, "cls", run)
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "each row is read as its source reports it" in html
    table = html[html.index("<h3>Accuracy</h3>") : html.index("<h3>Parameters")]
    vca = table[table.index('<td>DeiT-T<div class="note">VCA</div>') :]
    assert "75.7" in vca[: vca.index("</tr>")] and "best epoch" in vca[: vca.index("</tr>")]
    gains = json.loads((project / "reports" / "results.json").read_text())["gains"]
    deit = next(g for g in gains if g["model"] == "DeiT-T")
    assert abs(deit["ours_value"] - (75.7 - 72.2)) < 1e-9  # best (VCA) minus final (baseline), as the sources


def test_a_seed_that_did_not_converge_is_flagged_in_the_runs_table_and_every_interval_it_enters(project):
    add_vca_and_baseline(project)
    (project / "metrics" / "cls_reference.json").write_text(
        json.dumps({"computed": True, "logreg_top1": 61.0, "method": "logistic regression", "n_train": 10, "n_val": 10})
    )
    run = project / "runs" / "cls" / "deit_tiny-mhsa" / "metrics.json"
    metrics = json.loads(run.read_text())
    metrics.update(plateau_spread_seed0=0.4, plateau_spread_seed1=3.5)  # seed 1 still moving by 3.5 points
    run.write_text(json.dumps(metrics))
    vouch(project, "cls", "deit_tiny-mhsa")
    html = render_report(project, project / "reports" / "index.html").read_text()
    runs = html[html.index('<h2 id="runs">') : html.index("<h2>Generation runs")]
    row = runs[runs.index("<code>deit_tiny-mhsa</code>") :]
    row = row[: row.index("</tr>")]
    # seed 0 ends at 58 < 61 (below the reference); seed 1 at 62 has not flattened
    assert "seed 0: ends below the logistic-regression reference (58.0 &lt; 61.0)" in row
    assert "seed 1: not flattened (last 3 evaluations span 3.5 points)" in row
    vca = runs[runs.index("<code>deit_tiny-vca</code>") :]
    assert 'class="flag"' not in vca[: vca.index("</tr>")]  # 87.2 and 89.3: above it, no spread recorded
    gain = html[html.index("What VCA brings") :]
    gain = gain[gain.index("<td>DeiT-T<") :]
    gain = gain[: gain.index("</tr>")]
    assert "2 seeds flagged: below reference, not flattened" in gain  # seed 0 and seed 1, one flag each
    deit = next(r for r in summary_rows(project) if r["claim"] == "DeiT-T: VCA minus baseline, top-1")
    assert "deit_tiny-mhsa seed 1: not flattened" in deit["flags"]


def summary_row(html, claim):
    """The summary table's row of ``claim``, as HTML."""
    table = html[html.index('<table id="summary-table">') :]
    row = table[table.index(f"<tr><td>{claim}<") :]
    return row[: row.index("</tr>")]


def test_the_summary_says_in_words_when_every_seed_it_compares_is_flagged(project):
    (project / "metrics" / "cls_reference.json").write_text(
        json.dumps({"computed": True, "logreg_top1": 90.0, "method": "logistic regression", "n_train": 10, "n_val": 10})
    )
    # 3 + 2 seeds, every one below 90; spreads wide enough that Holm resolves nothing ("not resolved")
    write_seeds(project, "cls", "deit_tiny-mhsa", "top1", [80.0, 85.0, 70.0])
    write_seeds(project, "cls", "deit_tiny-vca", "top1", [83.0, 72.0])
    run = project / "runs" / "cls" / "deit_tiny-vca" / "metrics.json"
    metrics = json.loads(run.read_text())
    metrics.update(plateau_spread_seed0=3.0, plateau_spread_seed1=0.2)  # one VCA seed also still moving
    run.write_text(json.dumps(metrics))
    vouch(project, "cls", "deit_tiny-vca")
    html = render_report(project, project / "reports" / "index.html").read_text()
    row = summary_row(html, "DeiT-T: VCA minus baseline, top-1")
    assert "not resolved with" in row
    words = (
        "all 5 seeds of both runs end below the logistic-regression reference (1 had not flattened): "
        "the comparison is of unconverged models"
    )
    assert words in row and words in summary_row(html, "VCA lifts DeiT-T from 72.2 to 75.6 top-1")
    assert "deit_tiny-vca seed 0: not flattened" in row  # each seed and why, still on hover
    # between the paper's +3.4 and ours: ours is at the embedded scale, not comparable
    assert "embedded scale: not comparable with the paper&#39;s +3.4; only its sign can agree" in row
    # the page's words only: the exports (results.json is a DVC output) keep their columns
    assert "unconverged" not in (project / "reports" / "results.json").read_text()
    assert "unconverged" not in (project / "reports" / "tables" / "summary.csv").read_text()

    # one VCA seed above the reference and converged: the flags stay a mark, no sentence
    write_seeds(project, "cls", "deit_tiny-vca", "top1", [83.0, 95.0])
    html = render_report(project, project / "reports" / "index.html").read_text()
    row = summary_row(html, "DeiT-T: VCA minus baseline, top-1")
    assert "4 seeds flagged: below reference" in row and "unconverged" not in row
    assert "embedded scale: not comparable" in row


def test_a_status_that_already_says_not_comparable_gets_no_second_note(project):
    add_vca_and_baseline(project)  # +28.25 [+14.81, +41.69]: same direction, size not comparable
    html = render_report(project, project / "reports" / "index.html").read_text()
    row = summary_row(html, "DeiT-T: VCA minus baseline, top-1")
    assert "same direction, size not comparable" in row and "embedded scale: not comparable" not in row


def test_the_words_on_flags_count_the_seeds_of_every_run_compared():
    from vcarepro.report.convergence import unconverged

    below = "{} seed {}: ends below the logistic-regression reference (50.0 < 61.0)"
    flags = [below.format("a", s) for s in (0, 1, 2)] + [below.format("b", s) for s in (0, 1, 2)]
    assert unconverged(flags, [("a", 3), ("b", 3)]) == (
        "all 6 seeds of both runs end below the logistic-regression reference: the comparison is of unconverged models"
    )
    assert unconverged(flags, [("a", 3), ("b", 4)]) is None  # b's fourth seed converged
    assert unconverged(flags, [("a", 3), ("b", 3), ("c", 2)]) is None  # c has no flag at all
    assert unconverged(flags[:3], [("a", 3), ("a", 3)]).startswith("all 3 seeds of a end below")  # a run counts once
    mixed = [below.format("a", 0), "a seed 1: not flattened (last 3 evaluations span 2.0 points)"]
    mixed.append("b seed 0: training loss still falling (9% over the last tenth of its steps)")
    assert unconverged(mixed, [("a", 2), ("b", 1)]) == (
        "all 3 seeds of both runs are flagged (1 ends below the logistic-regression reference; 1 had not flattened; "
        "1 still had a falling training loss): the comparison is of unconverged models"
    )
    assert unconverged([], []) is None


def test_second_hand_paper_values_are_marked_and_so_is_every_verdict_against_one(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    compute = html[html.index("<h3>Parameters and GMACs") : html.index("Where the gain comes from")]
    row = compute[compute.index('<td>DeiT-T<div class="note">VCA</div>') :]
    row = row[: row.index("</tr>")]
    # 6.0M is from third-party notes [N]: marked unverified, and so is the "matches" against it
    assert '6.00<span class="src">[N]</span><span class="unv"' in row and "matches paper (unverified value)" in row
    accuracy = html[html.index("<h3>Accuracy</h3>") : html.index("<h3>Parameters")]
    vca = accuracy[accuracy.index('<td>DeiT-T<div class="note">VCA</div>') :]
    assert '75.6<span class="src">[A]</span><div' in vca  # the abstract's value: no mark
    # the legend of the marks sits in the summary, before the first mark of a table
    assert html.index("<strong>Sources of the paper's numbers</strong>") < html.index('<span class="src">')


def test_the_gains_figure_draws_only_what_was_measured_in_panels_of_its_own():
    row = {
        "metric": "top1",
        "label": "DeiT-T",
        "paper_value": 3.4,
        "ours_value": 2.0,
        "ours_low": 1.0,
        "ours_high": 3.0,
        "scale": "embedded",
    }
    assert gains_png([dict(row, ours_value=None, ours_low=None, ours_high=None)]) is None  # nothing measured
    import matplotlib.pyplot as plt

    drawn = []
    real = plt.subplots

    def spy(*args, **kwargs):
        fig, axes = real(*args, **kwargs)
        drawn.append(axes)
        return fig, axes

    plt.subplots = spy
    try:
        assert gains_png([row, dict(row, label="PVT-T", ours_value=None, ours_low=None, ours_high=None)])
    finally:
        plt.subplots = real
    ((paper, ours),) = drawn[0]
    # the paper's bar and our interval on separate axes; the unmeasured PVT-T is not drawn as a zero
    assert [t.get_text() for t in paper.get_yticklabels()] == ["DeiT-T"]
    assert len(paper.patches) == 1 and len(ours.patches) == 0 and ours.lines
    assert paper.get_title().startswith("paper") and ours.get_title().startswith("ours (embedded")


def test_changes_since_head_is_one_sentence_when_every_row_is_new(monkeypatch):
    from pathlib import Path

    from vcarepro.report import changes

    params = compose([])
    monkeypatch.setattr(changes, "_params_at", lambda rev, root: params)
    monkeypatch.setattr(changes, "_metrics_at", lambda rev, root, targets: {t: {} for t in targets})
    run_metrics = {"cls": {"deit_tiny-vca": {"top1": 70.0, "top5": 99.0}, "deit_tiny-mhsa": {"top1": 60.0}}, "gen": {}}
    out = changes.changes_since(Path("."), params, run_metrics)
    assert out["metrics"] == [] and out["metrics_sentence"] == (
        "All 3 headline metrics that differ, of 2 runs, are absent at HEAD (new since then); none changed value."
    )


def test_sample_grids_are_captioned_with_run_and_seed_beside_real_training_images(project):
    import numpy as np
    from PIL import Image
    from safetensors.numpy import save_file

    gen = project / "data" / "gen"
    gen.mkdir(parents=True)
    images = np.arange(40 * 4 * 4, dtype=np.uint8).reshape(40, 1, 4, 4)
    save_file(
        {"images": images, "labels": np.repeat(np.arange(4), 10), "num_classes": np.array(4)},
        str(gen / "train.safetensors"),
    )
    (gen / "meta.json").write_text(json.dumps({"kind": "pixels"}))
    samples = project / "runs" / "gen" / "dit_s2-vca" / "samples"
    samples.mkdir(parents=True)
    for seed in (0, 1):
        Image.new("L", (33, 41), 128).save(samples / f"grid_seed_{seed}.png")
    (samples.parent / "metrics.json").write_text(json.dumps({"fid": 30.0, "fid_std": 1.0, "n_seeds": 2}))
    vouch(project, "gen", "dit_s2-vca")
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = html[html.index("<h2>Samples") : html.index("<h2>Parameters of this run")]
    assert "<figcaption><code>dit_s2-vca</code>, seed 0</figcaption>" in section
    assert "<figcaption><code>dit_s2-vca</code>, seed 1</figcaption>" in section
    uri = re.search(r'<img alt="training images" src="data:image/png;base64,([^"]+)"', section).group(1)
    import base64
    import io

    grid = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri))))
    # four classes (rows) of eight images of 4x4 with one pixel of padding, as sample_gen lays out its grids
    assert grid.shape == (4 * 5 + 1, 8 * 5 + 1)
    assert (grid[1:5, 1:5] == images[0, 0]).all() and (grid[6:10, 1:5] == images[10, 0]).all()
    (gen / "meta.json").write_text(json.dumps({"kind": "latents"}))
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert 'alt="training images"' not in html and "train on VAE latents at this scale" in html


def test_every_glossary_link_has_its_entry_and_the_first_uses_link_to_it(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    links = set(re.findall(r'href="#(g-[^"]+)"', html))
    ids = set(re.findall(r'id="(g-[^"]+)"', html))
    assert links and links <= ids
    for term in (
        "g-embedded-scale",
        "g-lab-recipe",
        "g-stage",
        "g-kid",
        "g-pm",
        "g-default-budget",
        "g-gmacs",
        "g-holm",
        "g-welch",
    ):
        assert term in ids and term in links, term
    assert html.index('href="#g-embedded-scale"') < html.index('id="summary-table"')


def paper_scale_project(project, runs):
    """The fixture at paper scale with the given gen runs' metrics (paper protocol unless overridden)."""
    (project / "params.yaml").write_text(yaml.safe_dump(compose(["scale=paper"])))
    protocol = {
        "sampler": "ddpm",
        "sampler_steps": 250,
        "cfg_scale": 1.0,
        "labels": "random",
        "decoder": "stabilityai/sd-vae-ft-ema",
        "train_precision": "tf32",
        "reference": "adm",
        "num_samples": 50000,
        "n_seeds": 1,
    }
    for run, metrics in runs.items():
        (project / "runs" / "gen" / run).mkdir(parents=True, exist_ok=True)
        (project / "runs" / "gen" / run / "metrics.json").write_text(json.dumps({**protocol, **metrics}))
        vouch(project, "gen", run)
    render_report(project, project / "reports" / "index.html")
    return {r["claim"]: r for r in summary_rows(project)}


def test_at_paper_scale_a_fid_is_judged_in_the_summary_only_where_both_runs_followed_the_protocol(project):
    rows = paper_scale_project(project, {"dit_s2-mhsa": {"fid": 67.0}, "dit_s2-vca": {"fid": 62.5}})
    assert rows["DiT-S/2: VCA minus baseline, FID"]["status"] == REPRODUCED  # -4.5 against -4.9, within 1.0
    assert "judged against an unverified paper value" in rows["DiT-S/2: VCA minus baseline, FID"]["note"]  # [S]
    rows = paper_scale_project(project, {"dit_s2-mhsa": {"fid": 67.0, "reference": "own"}, "dit_s2-vca": {"fid": 62.5}})
    # the baseline used its own reference statistics: Table 2 says not comparable, and so does the summary
    assert rows["DiT-S/2: VCA minus baseline, FID"]["status"] == "not resolved with 1 seed"


def test_at_paper_scale_the_lab_recipe_baseline_is_read_as_its_differences_are(project):
    (project / "params.yaml").write_text(yaml.safe_dump(compose(["scale=paper"])))
    for run, final, best in (
        ("deit_tiny-mhsa", 72.0, 72.3),
        ("deit_tiny-mhsa-lab", 73.0, 73.6),
        ("deit_tiny-vca", 75.0, 75.6),
    ):
        (project / "runs" / "cls" / run).mkdir(parents=True, exist_ok=True)
        (project / "runs" / "cls" / run / "metrics.json").write_text(
            json.dumps({"top1": final, "top1_best": best, "n_seeds": 1})
        )
        vouch(project, "cls", run)
    html = render_report(project, project / "reports" / "index.html").read_text()
    table = html[html.index("<h3>Accuracy</h3>") : html.index("<h3>Parameters")]
    twin = table[table.index("<code>deit_tiny-mhsa-lab</code>") :]
    assert "73.6" in twin[: twin.index("</tr>")]  # the lab's code reports the best epoch, as for its VCA row
    decomposition = json.loads((project / "reports" / "results.json").read_text())["decomposition"]
    recipe = next(r for r in decomposition if r["model"] == "DeiT-T" and r["part"].startswith("recipe"))
    assert recipe["ours"].startswith("+1.60")  # 73.6 (best, as its cell) minus 72.0 (DeiT's final, as its cell)
    attention = next(r for r in decomposition if r["model"] == "DeiT-T" and r["part"].startswith("attention"))
    assert attention["ours"].startswith("+2.00")  # 75.6 - 73.6: both best epoch, as their cells


def test_a_compute_claim_without_its_measurement_says_which_stage_measures_it(project):
    (project / "metrics" / "complexity.json").unlink()
    render_report(project, project / "reports" / "index.html")
    rows = {r["claim"]: r for r in summary_rows(project)}
    assert (
        rows["VCA adds no FLOPs"]["status"] == NOT_RUN
        and rows["VCA adds no FLOPs"]["command"] == "dvc repro complexity"
    )
    assert rows["complexity O(N n C) with n << N"]["command"] == "dvc repro attention_cost"


def test_a_flagged_seed_is_marked_on_the_family_differences_it_enters(project):
    (project / "params.yaml").write_text(yaml.safe_dump(compose(["family=all"])))
    (project / "metrics" / "cls_reference.json").write_text(
        json.dumps({"computed": True, "logreg_top1": 85.0, "method": "logistic regression", "n_train": 10, "n_val": 10})
    )
    write_seeds(project, "cls", "deit_tiny-mhsa", "top1", [80.0, 81.0, 82.0])  # every seed below 85
    write_seeds(project, "cls", "deit_tiny-agent", "top1", [90.0, 91.0, 92.0])
    html = render_report(project, project / "reports" / "index.html").read_text()
    ours = html[html.index("<h3>Our runs</h3>") :]
    row = ours[ours.index("<tr><td>Agent") :]
    row = row[: row.index("</tr>")]
    assert "3 seeds flagged: below reference" in row  # Agent minus MHSA rests on MHSA's three seeds
