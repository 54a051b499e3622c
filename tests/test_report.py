"""The report: paper beside ours, verdicts that never judge across scales, escaped, offline."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, add_vca_and_baseline, project, vouch, write_seeds  # noqa: F401  (project: fixtures)
from vcarepro.params.config import compose
from vcarepro.report.reference import PaperValue, load_reference, paper_value
from vcarepro.report.render import render_report
from vcarepro.report.verdicts import (
    BETTER,
    DIFFERS,
    MATCHES,
    NO_PAPER_VALUE,
    NOT_COMPARABLE,
    NOT_RUN,
    REPRODUCED,
    SHORT,
    Measured,
    exact_verdict,
    verdict,
)


def ours(mean, n=1):
    return Measured(mean, 0.0, n, "paper")


@pytest.mark.parametrize(
    "paper, mine, lower, expected",
    [
        (75.6, 75.4, False, REPRODUCED),
        (75.6, 76.5, False, BETTER),
        (75.6, 74.0, False, SHORT),
        (62.3, 60.0, True, BETTER),
        (62.3, 65.0, True, SHORT),
    ],
)
def test_verdicts_at_paper_scale(paper, mine, lower, expected):
    assert (
        verdict(PaperValue(paper, "S"), ours(mine), comparable=True, tolerance=0.5, lower_is_better=lower) == expected
    )


def test_a_smoke_scale_number_is_never_judged():
    assert (
        verdict(PaperValue(75.6, "A"), ours(99.0), comparable=False, tolerance=0.5, lower_is_better=False)
        == NOT_COMPARABLE
    )
    assert verdict(PaperValue(75.6, "A"), None, comparable=True, tolerance=0.5, lower_is_better=False) == NOT_RUN
    assert (
        verdict(PaperValue(None, None), ours(1.0), comparable=True, tolerance=0.5, lower_is_better=True)
        == NO_PAPER_VALUE
    )


def test_exact_quantities_match_within_one_unit_of_the_papers_precision():
    tolerance = compose([])["report"]["complexity_tolerance"]
    assert tolerance == 0.1
    assert exact_verdict(PaperValue(6.0, "N"), 5.974, tolerance) == MATCHES
    assert exact_verdict(PaperValue(1.2, "N"), 1.257, tolerance) == MATCHES  # DeiT-T + VCA GMACs
    assert exact_verdict(PaperValue(1.2, "N"), 1.3001, tolerance) == DIFFERS
    assert exact_verdict(PaperValue(11.6, "N"), 13.2, tolerance) == DIFFERS
    assert exact_verdict(PaperValue(20.5, "N"), 22.3, tolerance) == DIFFERS  # the original CSWin-T, 1-2-21-1


def test_reference_data_is_valid_and_holds_the_conflict():
    ref = load_reference(ROOT / "data" / "paper_reference.yaml")
    rows = {r["variant"]: r for r in ref["table3"]["rows"]}
    assert rows["VCA in Stage I only"]["top1"] == [75.5, "S"]
    assert rows["VCA in Stage I only"]["conflict"]["top1"] == [75.4, "N"]
    with pytest.raises(ValueError, match="source 'X' is not one of"):
        paper_value([1.0, "X"], ref["sources"])
    with pytest.raises(ValueError, match="both a value and a source"):
        paper_value([1.0, None], ref["sources"])


def accuracy_row(html, model, attention):
    """Table 1's accuracy row of ``model`` / ``attention`` (the compute table follows it)."""
    table = html[html.index("<h3>Accuracy</h3>") : html.index("<h3>Parameters and GMACs")]
    row = table[table.index(f'<td>{model}<div class="note">{attention}</div></td>') :]
    return row[: row.index("</tr>")]


def test_report_shows_paper_beside_ours_without_judging_embedded_numbers(project):
    write_seeds(project, "cls", "deit_tiny-vca-stage1_only", "top1", [70.0, 71.0])
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "Embedded scale</a>: no size below is comparable with the paper" in html
    assert "75.6" in html and "[A]" in html  # the paper's DeiT-T +VCA value with its source
    row = accuracy_row(html, "DeiT-T", "VCA")
    # the paper's VCA number is the lab's best epoch; at this scale every number is the final epoch's (one rule)
    assert "paper: best epoch; ours: final epoch" in row and "88.2 ± 1.5 (n=2)" in row and "90.5" not in row
    assert NOT_COMPARABLE in row and REPRODUCED not in row and SHORT not in row
    assert "-1.0" not in row and "+0.0" not in row.split(NOT_COMPARABLE)[0]  # no difference for smoke numbers
    compute = html[html.index("<h3>Parameters and GMACs") : html.index("Where the gain comes from")]
    assert MATCHES in compute  # 5.974M params at paper shape vs the paper's 6.0M
    # every row of the paper's table stays, run or not (a paper number never folds): a row not run shows the
    # paper's number and one "not run" mark over our cells, keyed to the line below that says how to run it
    table = html[html.index("<h3>Accuracy</h3>") : html.index("<h3>Parameters and GMACs")]
    assert table.count("<tr>") == 1 + 17 and table.count('<td colspan="3" class="verdict not-run">not run <a') == 16
    small = accuracy_row(html, "DeiT-S", "VCA")
    assert '80.7<span class="src">[N]</span>' in small
    assert 'class="verdict not-run">not run <a href="#howto-table1-' in small
    key = re.search(r'href="#howto-table1-(\w)"', small).group(1)
    line = table[table.index(f'<p class="folded" id="howto-table1-{key}">') :].split("</p>")[0]
    assert (
        "To run: at smoke scale, <code>dvc exp run --temp -S scale=smoke -n smoke</code>; or at paper scale, "
        "<code>git switch -c paper &amp;&amp; python -m vcarepro.params.config scale=paper "
        "prepare_cls.imagenet_root=/path/to/imagenet &amp;&amp; dvc repro</code>."
    ) in line
    baseline = accuracy_row(html, "DeiT-T", "MHSA")  # in this scale's run list, no numbers yet
    key = re.search(r'href="#howto-table1-(\w)"', baseline).group(1)
    assert table[table.index(f'id="howto-table1-{key}"') :].split("</p>")[0].endswith("To run: <code>dvc repro</code>.")
    assert "dvc repro (runs of this scale)" not in html  # each line one way to run its rows, not several mixed
    assert "other summary: 75.4" in html  # the Table 3 conflict is shown where the row was run
    contrast = compose([])["cls_shape"]["contrast_tokens"]
    assert f"contrast_tokens={contrast}, stage2=diff" in html  # the options the run used, not the paper shape's


def test_report_escapes_names_and_works_offline(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert not re.search(r"""(src|href)=["']https?://""", html)  # nothing loads from the network
    assert "data:image/png;base64," in html  # the loss curve is embedded


def test_report_lists_the_knobs_that_differ_from_the_papers_recipe_in_one_table(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = html[html.index("<h2>Recipes") : html.index("<h2>Changes since")]
    cls = section[section.index("<h3>Classification</h3>") : section.index("<h3>Generation</h3>")]
    assert cls.count("<table") == 1  # one table of knobs, not a list per run
    # the columns: each recipe the paper's runs use, then what every run trains with here
    assert ">paper: deit (1 run)</th>" in cls and ">paper: lab_deit_tiny (6 runs)</th>" in cls
    assert ">this run (all 7 runs)</th>" in cls
    epochs = compose([])["cls_recipe_overrides"]["epochs"]
    assert f"<code>recipe.epochs</code></td><td>300</td><td>300</td><td>{epochs}</td>" in cls
    assert "<code>recipe.drop_path</code></td><td>0.1</td><td>0.0</td><td>0.0</td>" in cls  # deit vs lab
    assert "<code>recipe.lr</code>" in cls and "<code>recipe.workers</code>" in cls
    assert "options." not in cls  # attention options belong to the model (the runs table)
    gen = section[section.index("<h3>Generation</h3>") :]
    assert ">paper: gen_recipe (" in gen and "<code>sampling.num_samples</code></td><td>50000</td>" in gen


def test_attention_times_from_another_configuration_or_none_are_not_shown(project):
    add_vca_and_baseline(project)
    timings = project / "timings" / "attention_cost.json"
    stale = json.loads(timings.read_text())
    stale["config"] = {"sides": [7]}  # measured with other settings than the MACs beside them
    timings.write_text(json.dumps(stale))
    html = render_report(project, project / "reports" / "index.html").read_text()
    assert "Not measured in this workspace" in html and "dvc repro -f -s attention_cost" in html
    timings.unlink()  # a workspace from `dvc pull`: no wall times at all
    assert "Not measured in this workspace" in render_report(project, project / "reports" / "index.html").read_text()


def test_report_shows_the_vca_gain_beside_the_papers_with_its_direction(project):
    add_vca_and_baseline(project)
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = html[html.index("What VCA brings") : html.index("<h2>Table 3")]
    row = section[section.index("<td>DeiT-T<") :]
    row = row[: row.index("</tr>")]
    # ours: 88.25 - 60.0 = +28.25 over seeds (87.2, 89.3) and (58, 62), Welch's 95% interval [+14.81, +41.69]
    # (2.26 s.e. on 1.51 degrees of freedom); the paper's: 75.6 - 72.2 = +3.4; the only comparison: Holm = raw
    assert "+28.25 [+14.81, +41.69] (95% Welch, n=2 vs 2)" in row
    assert "+3.4" in row and "same direction as paper (resolved)" in row and "(Holm over 1)" in section
    assert "embedded" in row  # the scale travels with the number
    folded = section[section.index('<p class="folded"') :]
    assert all(m in folded for m in ("DeiT-S", "PVT-T", "Swin-T", "CSwin-T", "SiT-S/4"))
    # header, DeiT-T and every other model with a paper difference, run or not (Tables 1 and 2: 4 + 5); nothing
    # shown as a zero it did not measure: a row not run has one "not run" mark over our columns
    rows = section.split("<tr>")[2:]
    assert section.count("<tr>") == 2 + 9 and "<td>SiT-S/4<" not in section  # no paper difference, not run: folded
    for r in rows[1:]:
        assert '<td colspan="2" class="verdict not-run">not run <a href="#howto-gains-' in r and "embedded" not in r


def test_a_gain_whose_interval_holds_zero_or_rests_on_one_seed_gets_no_direction(project):
    add_vca_and_baseline(project, base_top1=86.0)  # seeds 84 and 88 against VCA's 87.2 and 89.3
    gen = project / "runs" / "gen"
    for run, seeds in (
        ("dit_s2-mhsa", [60.0, 62.0, 61.0]),
        ("dit_s2-vca", [59.0, 62.5, 60.0]),
        ("sit_s2-mhsa", [55.0]),
        ("sit_s2-vca", [50.0]),
    ):
        (gen / run).mkdir(parents=True)
        (gen / run / "metrics.json").write_text(
            json.dumps(
                {
                    "fid": statistics.fmean(seeds),
                    "fid_std": statistics.stdev(seeds) if len(seeds) > 1 else 0.0,
                    "n_seeds": len(seeds),
                    **{f"fid_seed{i}": v for i, v in enumerate(seeds)},
                }
            )
        )
        vouch(project, "gen", run)
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = html[html.index("What VCA brings") : html.index("<h2>Table 3")]
    rows = {r.split("<td>")[1].split("<")[0]: r for r in section.split("<tr>")[2:]}
    assert "not resolved with 2 seeds" in rows["DeiT-T"] and "rough: about" in rows["DeiT-T"]
    assert "not a power calculation" in rows["DeiT-T"]  # a projection, labelled as one
    assert "not resolved with 3 seeds" in rows["DiT-S/2"] and "direction as paper" not in rows["DiT-S/2"]
    assert "one seed: no error estimate" in rows["SiT-S/2"] and "direction" not in rows["SiT-S/2"]
    assert "direction as paper" not in section and "opposite direction" not in section


def test_table1_shows_each_backbones_rows_and_splits_the_gain_into_recipe_and_attention(project):
    add_vca_and_baseline(project)
    html = render_report(project, project / "reports" / "index.html").read_text()
    table = html[html.index("<h2>Table 1") : html.index("<h2>Table 2")]
    assert "At this scale the recipes collapse into one" in table
    # the lab-recipe twin of the DeiT-T baseline is not a run of its own here: the same run trains both
    twin = table[table.index("<code>deit_tiny-mhsa-lab</code>") :]
    assert twin.index("same run as <code>deit_tiny-mhsa</code>") < twin.index("</tr>")
    for role in ("baseline (original recipe)", "baseline (lab&#39;s recipe)", "VCA (lab&#39;s recipe)"):
        assert f"<td>{role}</td>" in table
    # DeiT's number is the final epoch's, as ours; the lab's is the best epoch's, ours still the final one
    assert "final epoch</div>" in accuracy_row(html, "DeiT-T", "MHSA")
    assert "paper: best epoch; ours: final epoch" in accuracy_row(html, "DeiT-T", "VCA")
    split = table[table.index("Where the gain comes from") :]
    rows = [r for r in split.split("<tr>") if "<td>DeiT-T</td>" in r]
    assert len(rows) == 3  # total, recipe, attention
    assert "+3.4" in rows[0] and "+28.25 [+14.81, +41.69]" in rows[0]  # 75.6 - 72.2; 88.25 - 60.0
    # total and attention compare the same two runs here (the twin is the baseline run): one comparison in Holm's m
    assert "same direction as paper (resolved)" in rows[0] and "(Holm over 1)" in split and "p (Holm) 0.017" in rows[0]
    assert "recipe:" in rows[1] and "0 (the same run at this scale)" in rows[1]
    assert "attention:" in rows[2] and "+28.25 [+14.81, +41.69]" in rows[2] and "positive (resolved)" in rows[2]
    assert "p (Holm) 0.017" in rows[2]
    # every backbone's paper gain stays (its total row, not run, one mark over our columns); the parts with no paper
    # number fold into the lines that say how to run them: 14 parts not run in all
    cswin = [r for r in split.split("<tr>") if "<td>CSwin-T</td>" in r]
    assert len(cswin) == 1 and "total:" in cswin[0] and "<td>+0.6</td>" in cswin[0]
    assert '<td colspan="2" class="verdict not-run">not run <a href="#howto-decomposition-' in cswin[0]
    counts = re.findall(r'id="howto-decomposition-\w">Not run at this scale \((\d+) parts?', split)
    hidden = re.findall(r"(\d+) not shown, with no paper number", split)
    assert sum(map(int, counts)) == 14 and sum(map(int, hidden)) == 14 - 4  # 4 totals shown, 10 parts folded
    assert all(m in split.split('<p class="folded"', 1)[1] for m in ("DeiT-S", "PVT-T", "Swin-T", "CSwin-T"))


def test_report_checks_the_linear_cost_claim_from_the_attention_cost_stage(project):
    add_vca_and_baseline(project)
    html = render_report(project, project / "reports" / "index.html").read_text()
    claim = html[html.index("O(N n C)") :]
    claim = claim[: claim.index("</tr>")]
    assert "VCA MACs 16.0x, MHSA 256.0x" in claim and '">reproduced<' in claim
    assert "Test CPU" not in claim  # wall times are this machine's record: the claims export, not the summary
    assert "time VCA 16.0x, MHSA 300.0x (Test CPU)" in (project / "reports" / "tables" / "claims.csv").read_text()
    assert "grow no faster than the token count" in claim  # the tolerance, in words
    assert 'alt="attention MACs and time against token count"' in html
    results = (project / "reports" / "results.json").read_bytes()
    (project / "timings" / "attention_cost.json").unlink()  # after `dvc pull`: the exact MACs still decide
    claim = render_report(project, project / "reports" / "index.html").read_text()
    assert (project / "reports" / "results.json").read_bytes() == results  # the DVC output holds no wall time
    claim = claim[claim.index("O(N n C)") :]
    claim = claim[: claim.index("</tr>")]
    assert "VCA MACs 16.0x, MHSA 256.0x" in claim and "Test CPU" not in claim and '">reproduced<' in claim


def test_report_exports_every_table_as_csv_and_markdown(project):
    add_vca_and_baseline(project)
    render_report(project, project / "reports" / "index.html")
    tables = project / "reports" / "tables"
    for name in (
        "summary",
        "table1",
        "decomposition",
        "table2",
        "table3",
        "table4",
        "gains",
        "table3_gains",
        "table4_gains",
        "claims",
        "cls_runs",
        "gen_runs",
        "complexity",
    ):
        assert (tables / f"{name}.csv").is_file() and (tables / f"{name}.md").is_file(), name
    table1 = (tables / "table1.csv").read_text().splitlines()
    assert table1[0].startswith(
        "model,attention,role,recipe,run,same_as,top1 paper,top1 ours,top1 scale,top1 diff,"
        "top1 verdict,top1 source,top1 unverified,top1 statistic"
    )
    assert any(
        line.startswith(
            "DeiT-T,VCA,VCA (lab's recipe),lab_deit_tiny,deit_tiny-vca,,75.6,88.2 ± 1.5 (n=2),"
            "embedded,,not comparable,A,False,paper: best epoch; ours: final epoch"
        )
        for line in table1
    ), table1
    # one name per quantity in every export: GMACs, never "gflops" / "FLOPs (G)"
    for path in tables.iterdir():
        assert "gflops" not in path.read_text().lower(), path.name
    html = (project / "reports" / "index.html").read_text()
    assert "gflops" not in html and "FLOPs (G)" not in html and ">GFLOPs<" not in html
    assert (tables / "gains.md").read_text().startswith("| table")


def test_report_shows_each_runs_options_and_the_environment(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    runs = html[html.index('<h2 id="runs">') : html.index("<h2>Generation runs")]
    row = runs[runs.index("<code>deit_tiny-vca</code>") :]
    row = row[: row.index("</tr>")]
    # the attention options the run used (the scale's contrast-token count), with its model and seeds
    contrast = compose([])["cls_shape"]["contrast_tokens"]
    assert f"vca (contrast_tokens={contrast})" in row and "seeds 0, 1, 2" in row
    assert "training images through the PIL input path" in row  # the digits are not augmented
    assert "<details><summary>params.yaml" in html  # the raw params are there, collapsed
    env = html[html.index("<h2>Environment</h2>") :]
    import torch

    assert f"<td>torch</td><td>{torch.__version__} (CUDA {torch.version.cuda})</td>" in env
    assert "not a git checkout" in env
    assert "params of HEAD are not readable" in html  # no git here: said, not hidden


def test_report_survives_a_nan_metric_and_a_missing_run(project):
    run = project / "runs" / "gen" / "dit_s2-vca"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text('{"fid": NaN, "n_seeds": 1}')
    vouch(project, "gen", "dit_s2-vca")
    html = render_report(project, project / "reports" / "index.html").read_text()
    table = html[html.index("<h2>Table 2") :]
    row = table[table.index('<td>DiT-S/2<div class="note">VCA</div></td>') :]
    row = row[: row.index("</tr>")]
    assert "nan" in row.lower() and "not a finite number" in row
    assert (
        verdict(PaperValue(62.3, "S"), ours(float("nan")), comparable=True, tolerance=1.0, lower_is_better=True)
        == "not a finite number"
    )  # never "short of paper"


def test_table2_judges_only_fids_that_followed_the_papers_protocol(tmp_path):
    for rel in ("conf", "data/paper_reference.yaml"):
        src = ROOT / rel
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / rel)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(compose(["scale=paper"])))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "complexity.json").write_text(json.dumps({"dit_s2-vca": {"params_m": 33.0, "gmacs": 6.0}}))
    paper_protocol = {
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
    runs = {
        "dit_s2-vca": dict(paper_protocol, fid=62.6),
        "dit_s2-mhsa": dict(paper_protocol, fid=67.0, reference="own", train_precision="bf16"),
        "sit_s2-vca": dict(paper_protocol, fid=53.1, sampler="flow-sde"),
    }
    for run, metrics in runs.items():
        (tmp_path / "runs" / "gen" / run).mkdir(parents=True)
        (tmp_path / "runs" / "gen" / run / "metrics.json").write_text(json.dumps(metrics))
        vouch(tmp_path, "gen", run)
    html = render_report(tmp_path, tmp_path / "reports" / "index.html").read_text()
    table = html[html.index("<h2>Table 2") : html.index("Original DiT, 400K steps")]

    def row(model, attention):
        part = table[table.index(f'<td>{model}<div class="note">{attention}</div></td>') :]
        return part[: part.index("</tr>")]

    assert REPRODUCED in row("DiT-S/2", "VCA") and "ddpm 250 steps, cfg 1.0, random labels" in row("DiT-S/2", "VCA")
    assert REPRODUCED in row("SiT-S/2", "VCA")  # SiT's own sampler: the SDE
    mhsa = row("DiT-S/2", "MHSA")
    assert NOT_COMPARABLE in mhsa and REPRODUCED not in mhsa and SHORT not in mhsa
    assert "own reference statistics (the paper&#39;s: ADM&#39;s reference batch)" in mhsa
    assert "trained in bf16 (the paper&#39;s: tf32)" in mhsa
    # the paper's protocol, stated by the formatter that words ours (vcarepro.metrics.protocol.describe)
    assert (
        "ddpm 250 steps (ddpm models) or flow-sde 250 steps (flow models), cfg 1.0, random labels, 50000 samples"
        in table
    )


def test_changes_since_head_is_one_line_when_heads_metrics_are_not_in_the_cache(monkeypatch):
    from vcarepro.report import changes

    params = compose([])
    monkeypatch.setattr(changes, "_params_at", lambda rev, root: params)
    monkeypatch.setattr(changes, "_metrics_at", lambda rev, root, targets: {t: None for t in targets})
    out = changes.changes_since(Path("."), params, {"cls": {"deit_tiny-vca": {"top1": 70.0}}, "gen": {}})
    assert out["metrics"] is None and out["params"] == []
    assert out["note"].startswith("HEAD's run metrics are not in this checkout's DVC cache (a fresh clone")
    monkeypatch.setattr(
        changes,
        "_metrics_at",
        lambda rev, root, targets: {t: ({"top1": 60.0} if "vca" in t else None) for t in targets},
    )
    out = changes.changes_since(
        Path("."), params, {"cls": {"deit_tiny-vca": {"top1": 70.0}, "deit_tiny-mhsa": {"top1": 50.0}}, "gen": {}}
    )
    assert [(r["run"], r["previous"], r["now"]) for r in out["metrics"]] == [
        ("deit_tiny-mhsa", "absent", "50"),
        ("deit_tiny-vca", "60", "70"),
    ]
    assert out["note"].startswith("1 run(s) have no metrics at HEAD") and "deit_tiny-mhsa" in out["note"]


def family_section(html):
    return html[html.index("<h2>The attention family") : html.index('<h2 id="runs">Classification runs')]


def test_family_section_says_not_run_and_how_to_run_it_when_the_switch_is_off(project):
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = family_section(html)
    assert "dvc exp run --temp -S family=all -n family" in section
    row = section[section.index("<tr><td>Agent") :]
    row = row[: row.index("</tr>")]
    # the published row with its source mark; our runs of it are one "not run" line with the command
    assert '74.9<span class="src">[M]</span>' in row
    ours = section[section.index("<h3>Our runs</h3>") : section.index("Where VCA's gain comes from")]
    assert (
        "Agent" in ours
        and ("at this scale, with the attention family, <code>dvc exp run --temp -S family=all -n family</code>")
        in ours
    )
    decomposition = section[section.index("Where VCA's gain comes from") :]
    # five per branch, none measured: the eight with a family run need the switch, the totals only `dvc repro`
    assert (
        "Not run at this scale (8 differences)" in decomposition
        and "(2 differences): DeiT-T: total: VCA minus MHSA, DiT-S/2: total: VCA minus MHSA. To run: "
        "<code>dvc repro</code>."
        in decomposition
    )
    assert "Agent" in (project / "reports" / "tables" / "family.csv").read_text()  # exported with the rest


def test_family_section_shows_each_member_against_mhsa_and_vca_with_intervals(project):
    params = compose(["family=all"])
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    (project / "metrics" / "complexity.json").write_text(
        json.dumps(
            {
                "deit_tiny-mhsa": {"params_m": 5.717, "gmacs": 1.254},
                "deit_tiny-vca": {"params_m": 5.974, "gmacs": 1.257},
                "deit_tiny-agent": {"params_m": 6.016, "gmacs": 1.168},
                "deit_tiny-agent-published": {"params_m": 6.016, "gmacs": 1.168},
                "deit_tiny-inline-published": {"params_m": 6.478, "gmacs": 1.309},
            }
        )
    )
    write_seeds(project, "cls", "deit_tiny-mhsa", "top1", [80.0, 81.0, 82.0])
    write_seeds(project, "cls", "deit_tiny-agent", "top1", [90.0, 91.0, 92.0])
    write_seeds(project, "cls", "deit_tiny-mhsa_dwc", "top1", [80.5, 81.0, 81.5])
    write_seeds(project, "cls", "deit_tiny-vca-no_dwc", "top1", [70.0, 80.0, 90.0])
    write_seeds(project, "gen", "dit_s2-mhsa", "fid", [30.0, 31.0, 32.0])
    write_seeds(project, "gen", "dit_s2-agent", "fid", [20.0, 21.0, 22.0])
    html = render_report(project, project / "reports" / "index.html").read_text()
    section = family_section(html)
    assert "family=all" not in section  # the switch is on: what is missing is `dvc repro` away
    ours = section[section.index("<h3>Our runs</h3>") :]
    row = ours[ours.index("<tr><td>Agent") :]
    row = row[: row.index("</tr>")]
    # Agent minus MHSA, both branches: +10.00 top-1 with a resolved positive sign, -10.00 FID (after Holm)
    assert "+10.00 [" in row and "positive (resolved)" in row
    assert "-10.00 [" in row and "negative (resolved)" in row and "p (Holm)" in row
    # the published model's counts at paper shape against the published 6.0M / 1.2G
    row = section[section.index("<tr><td>Agent") :]
    row = row[: row.index("</tr>")]
    assert "6.02" in row and "matches paper" in row
    inline = section[section.index("<tr><td>InLine") :]
    inline = inline[: inline.index("</tr>")]
    assert "1.31" in inline and "differs from paper" in inline  # 1.309 GMACs against the published 1.1G
    decomposition = section[section.index("Where VCA's gain comes from") :]
    rows = decomposition.split("<tr>")[2:]
    mhsa_dwc = next(r for r in rows if "depthwise term added to MHSA" in r and "DeiT-T" in r)
    assert "+0.00" in mhsa_dwc and "not resolved with 3 seeds" in mhsa_dwc and "resolved)" not in mhsa_dwc
    alone = next(r for r in rows if "without its depthwise term, minus MHSA" in r and "DeiT-T" in r)
    assert "not resolved with 3 seeds" in alone  # +-10 points of spread: no sign
    assert "DiT-S/2: total: VCA minus MHSA" in decomposition.split('<p class="folded"')[1]  # no dit_s2-vca here


def test_the_knob_table_gives_conf_s_reason_for_this_scale_s_value_and_none_for_an_override():
    """Issue 49: the reasons are data in conf/ so that the report reads them too: each row of the recipe table that
    differs from the paper carries the `why:` beside this scale's value, unless a -S override changed the value."""
    import copy

    from vcarepro.report.render import knob_reasons, recipe_knobs

    params, paper = compose([]), compose(["scale=paper"])
    reasons = yaml.safe_load((ROOT / "conf/scale/embedded.yaml").read_text())["cls_recipe_overrides"]["why"]
    rows = {r["knob"]: r for r in recipe_knobs(params, paper, knob_reasons(params, ROOT / "conf"))["cls"]["rows"]}
    assert rows["recipe.lr"]["why"] == " ".join(reasons["lr"].split())
    gen = {r["knob"]: r for r in recipe_knobs(params, paper, knob_reasons(params, ROOT / "conf"))["gen"]["rows"]}
    assert "flattens by about step 150" in gen["recipe.steps"]["why"]
    overridden = copy.deepcopy(params)
    overridden["cls_recipe_overrides"]["lr"] = 0.01  # what `dvc exp run -S cls_recipe_overrides.lr=0.01` composes
    rows = {
        r["knob"]: r for r in recipe_knobs(overridden, paper, knob_reasons(overridden, ROOT / "conf"))["cls"]["rows"]
    }
    assert rows["recipe.lr"]["why"] == "" and rows["recipe.epochs"]["why"]


def test_a_full_disk_leaves_the_previous_report_whole_and_no_temporary_file(project, small_disk):
    """The page, its tables and results.json on a disk that fills up: one sentence, every old file as it was."""
    from vcarepro.core.errors import DiskFull

    out = small_disk.path / "reports" / "index.html"
    render_report(project, out)
    before = small_disk.files()
    assert {"reports/index.html", "reports/results.json", "reports/tables/table1.csv"} <= set(before)
    write_seeds(project, "cls", "deit_tiny-vca-stage1_only", "top1", [70.0, 71.0])  # every table changes
    small_disk.fill()
    with pytest.raises(DiskFull, match="no space is left on the device while writing .*; free space there"):
        render_report(project, out)
    assert small_disk.files() == before  # not one file cut off, not one temporary file left beside them


def test_results_json_is_written_after_the_page(project, monkeypatch):
    """A report stopped while writing the page (a full disk, Ctrl-C) leaves results.json as old as the page."""
    import vcarepro.report.render as render

    out = project / "reports" / "index.html"
    render_report(project, out)
    page, results = out.read_bytes(), (out.parent / "results.json").read_bytes()
    write_seeds(project, "cls", "deit_tiny-vca-stage1_only", "top1", [70.0, 71.0])
    real = render.write_bytes

    def stopped_at_the_page(path, data, *args, **kwargs):
        if Path(path) == out:
            raise KeyboardInterrupt
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(render, "write_bytes", stopped_at_the_page)
    with pytest.raises(KeyboardInterrupt):
        render_report(project, out)
    assert out.read_bytes() == page and (out.parent / "results.json").read_bytes() == results
    monkeypatch.undo()
    render_report(project, out)
    assert (out.parent / "results.json").read_bytes() != results  # the new seeds did change it
