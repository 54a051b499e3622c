"""`python -m vcarepro.tools.export`: a trained run leaves the project in the layout timm and the Hugging Face Hub
read."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
import yaml
from timm.models import load_checkpoint

from helpers import ROOT
from vcarepro.core.errors import BadInput, MissingInput, UnknownName, run_stage
from vcarepro.core.io import save_tensors
from vcarepro.params.config import load_params
from vcarepro.params.runs import cls_run
from vcarepro.tools.export import CURVES, WEIGHTS, export_run, main
from vcarepro.train.classification import ClassifierSpec

RUN, BASELINE = "deit_tiny-vca", "deit_tiny-mhsa"
NUM_CLASSES = 10


def write_metrics(project: Path, run: str, top1_seeds):
    path = project / "runs" / "cls" / run
    path.mkdir(parents=True, exist_ok=True)
    metrics = {
        "n_seeds": len(top1_seeds),
        "top1": statistics.fmean(top1_seeds),
        "top1_std": statistics.stdev(top1_seeds),
        **{f"top1_seed{s}": v for s, v in enumerate(top1_seeds)},
        "top1_best": max(top1_seeds) + 1,
        "top1_best_std": 0.5,
        **{f"top1_best_seed{s}": v + 1 for s, v in enumerate(top1_seeds)},
    }
    (path / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project with the embedded params, the VCA run's seed 0 'trained' (random weights at the embedded
    shape, where train_cls writes them), both runs' metrics and a dvclive curve; no baseline weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("project")
    for rel in ("params.yaml", "data/paper_reference.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    run = cls_run(load_params(root / "params.yaml"), RUN)
    torch.manual_seed(0)
    model = ClassifierSpec.for_run(run).create(num_classes=NUM_CLASSES).eval()
    seed_dir = root / run.paths.seed_dir(0)
    seed_dir.mkdir(parents=True)
    save_tensors(seed_dir / WEIGHTS, model.state_dict())  # as train_cls writes it, with its digest
    write_metrics(root, RUN, [91.0, 93.5, 94.0])
    write_metrics(root, BASELINE, [87.0, 92.0, 95.0])
    curve = root / run.paths.live_dir / "plots" / "metrics" / "seed_0" / "val"
    curve.mkdir(parents=True)
    (curve / "top1.tsv").write_text("timestamp\tstep\ttop1\n0\t1\t50.0\n0\t2\t80.0\n")
    folder = export_run(RUN, root=root)
    yield root, model, folder
    torch.set_num_threads(threads)


def images(model, n=4):
    return torch.randn(n, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(1))


def test_the_folder_holds_config_weights_card_and_the_curves(project):
    root, _, folder = project
    assert folder == root / "exports" / RUN
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["config.json", WEIGHTS, "README.md", CURVES, "SHA256SUMS"]
    )
    assert not list(folder.parent.glob(".*.tmp"))  # written under a temporary name, then renamed
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "vca_deit_tiny_patch16_224"
    assert config["num_classes"] == NUM_CLASSES
    # the embedded shape, which differs from the registered DeiT-T defaults
    assert {
        k: config["model_args"][k]
        for k in ("img_size", "patch_size", "depth", "embed_dim", "num_heads", "contrast_tokens")
    } == {"img_size": [16, 16], "patch_size": 4, "depth": 3, "embed_dim": 64, "num_heads": 2, "contrast_tokens": 4}
    # the recipe's evaluation preprocessing, for timm's data config
    assert config["pretrained_cfg"]["input_size"] == [3, 16, 16]
    assert config["pretrained_cfg"]["crop_pct"] == 1.0 and config["pretrained_cfg"]["num_classes"] == NUM_CLASSES


def test_config_json_rebuilds_the_model_and_timms_load_checkpoint_gives_identical_outputs(project):
    _, model, folder = project
    config = json.loads((folder / "config.json").read_text())
    rebuilt = timm.create_model(config["architecture"], **config["model_args"]).eval()
    load_checkpoint(rebuilt, str(folder / WEIGHTS), strict=True)
    x = images(model)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))


def test_pretrained_true_with_a_file_overlay_gives_identical_outputs(project):
    _, model, folder = project
    config = json.loads((folder / "config.json").read_text())
    x = images(model)
    overlay = timm.create_model(
        config["architecture"],
        pretrained=True,
        pretrained_cfg_overlay=dict(config["pretrained_cfg"], file=str(folder / WEIGHTS)),
        **config["model_args"],
    ).eval()
    local_dir = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    with torch.no_grad():
        assert torch.equal(overlay(x), model(x))
        assert torch.equal(local_dir(x), model(x))


def test_the_card_states_scale_shape_recipe_metrics_gain_paper_numbers_and_how_to_load_and_push(project):
    _, _, folder = project
    card = (folder / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    meta = yaml.safe_load(front)
    assert {"image-classification", "timm"} <= set(meta["tags"])
    assert meta["library_name"] == "timm" and meta["license"]
    assert "Scale: embedded. These numbers are not comparable with the paper's." in body
    assert "| contrast_tokens | 4 |" in body and "| embed_dim | 64 |" in body
    assert "Recipe `lab_deit_tiny`" in body and "| epochs | 15 |" in body
    assert "92.83 ± 1.61 (n=3) | 91.00 | 91.00, 93.50, 94.00" in body  # mean ± std, this seed, every seed
    # the gain over the baseline run with its interval, beside the paper's gain (75.6 - 72.2), and no direction
    # claimed while the interval holds zero
    assert (
        f"minus `{BASELINE}` (top1): +1.50 [-7.20, +10.20] (95% Welch, n=3 vs 3); paper +3.4 [A/A]; "
        "not resolved with 3 seeds"
    ) in body
    # the paper's Table 1 row with its source mark, ours read with the same statistic (best epoch)
    assert (
        "| ImageNet-1K classification | DeiT-T VCA (vca) | 75.6 [A] | best | `top1_best` 93.83 ± 1.61 (n=3) "
        "| 72.2 [A] |"
    ) in body
    assert "A: the paper's abstract" in body
    assert "folder = 'exports/deit_tiny-vca'" in body  # named as the project names it
    assert "Stage ablation" in body and "Contrast-token generation" in body
    assert f"![training curves]({CURVES})" in body
    assert "pretrained=True" in body and "pretrained_cfg_overlay=" in body and "load_checkpoint" in body
    assert "huggingface-cli login" in body and "upload_folder" in body and "Nothing here uploads" in body


def test_the_cards_how_to_load_code_loads_the_weights_in_a_fresh_interpreter(project):
    """The card's snippet, run as a reader would (a new Python, in the project), builds the model from the folder
    with the exported weights: its import registers the models (``import vcarepro`` alone no longer does)."""
    root, model, folder = project
    body = (folder / "README.md").read_text()
    code = body.split("## How to load", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = code.split("# the same in one line")[0]  # the rest uploads to the Hub
    code += "import torch\nprint(sum(float(t.double().sum()) for t in model.state_dict().values()))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip()) == sum(float(t.double().sum()) for t in model.state_dict().values())


def test_an_unknown_run_a_seed_it_does_not_train_and_an_untrained_seed_are_one_sentence_each(project, tmp_path):
    root, _, _ = project
    with pytest.raises(UnknownName, match="no run 'nope' under cls_runs"):
        export_run("nope", root=root, out=tmp_path / "x")
    with pytest.raises(BadInput, match="trains seeds 0, 1, 2, not 7; pass one of them with --seed"):
        export_run(RUN, seed=7, root=root, out=tmp_path / "x")
    with pytest.raises(MissingInput, match=f"run `dvc repro train_cls@{BASELINE}` first"):
        export_run(BASELINE, root=root, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_force_replaces_only_a_previous_export_and_a_failed_export_leaves_nothing(project, tmp_path, monkeypatch):
    root, _, _ = project
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    for force in (False, True):  # a folder holding anything the export did not write is never removed, even forced
        with pytest.raises(BadInput, match="holds 'mine.txt', which no export of this tool wrote; even --force"):
            export_run(RUN, root=root, out=out, force=force)
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"] and (out / "mine.txt").read_text() == "keep"
    (out / "mine.txt").unlink()

    import vcarepro.tools.export as export

    def broken(*args, **kwargs):
        raise RuntimeError("killed while drawing")

    monkeypatch.setattr(export, "curves_png", broken)
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError, match="killed"):
        export_run(RUN, root=root, out=fresh)
    assert not fresh.exists() and not list(tmp_path.glob(".fresh.*"))
    monkeypatch.undo()

    export_run(RUN, root=root, out=out, force=True)  # an empty folder
    exported = sorted(["config.json", WEIGHTS, "README.md", CURVES, "SHA256SUMS"])
    assert sorted(p.name for p in out.iterdir()) == exported
    with pytest.raises(BadInput, match="holds a previous export; pass --force to replace it"):
        export_run(RUN, root=root, out=out)
    export_run(RUN, root=root, out=out, force=True)  # a previous export: replaced
    assert sorted(p.name for p in out.iterdir()) == exported
    (out / "notes.md").write_text("a user's notes beside the export")
    with pytest.raises(BadInput, match="holds 'notes.md', which no export"):
        export_run(RUN, root=root, out=out, force=True)
    assert (out / "notes.md").is_file() and sorted(p.name for p in out.iterdir()) == sorted([*exported, "notes.md"])
    # a folder sha256sum listed whole is not an export for all its SHA256SUMS: a download folder, say
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "data.bin").write_bytes(b"someone's download")
    (mirror / "SHA256SUMS").write_text(f"{'0' * 64}  data.bin\n")
    with pytest.raises(BadInput, match="holds 'data.bin', which no export"):
        export_run(RUN, root=root, out=mirror, force=True)
    assert sorted(p.name for p in mirror.iterdir()) == ["SHA256SUMS", "data.bin"]
    # nor is one whose SHA256SUMS is not text: refused in the same sentence, not a UnicodeDecodeError
    (mirror / "data.bin").rename(mirror / "config.json")
    (mirror / "SHA256SUMS").write_bytes(b"\xff\xfe binary")
    with pytest.raises(BadInput, match="holds 'config.json', which no export"):
        export_run(RUN, root=root, out=mirror, force=True)
    assert sorted(p.name for p in mirror.iterdir()) == ["SHA256SUMS", "config.json"]


def test_out_through_a_link_replaces_the_export_it_leads_to_and_keeps_the_link(project, tmp_path):
    """`--out LINK --force`: the link is followed under the rules of any folder (exports/ linked onto a larger
    disk), never a traceback from rmtree, never a removed folder that holds anything but an export."""
    root, _, _ = project
    disk = tmp_path / "disk"
    disk.mkdir()
    target = disk / "deit"
    link = tmp_path / "exports-link"
    link.symlink_to(target)  # dangling: the export is made where it leads
    assert export_run(RUN, root=root, out=link) == link
    assert link.is_symlink() and (target / "SHA256SUMS").is_file()
    first = (target / "SHA256SUMS").read_bytes()
    with pytest.raises(BadInput, match="holds a previous export; pass --force"):
        export_run(RUN, root=root, out=link)
    export_run(RUN, root=root, out=link, force=True)  # replaced through the link; the link stays a link
    assert link.is_symlink() and link.resolve() == target.resolve() and (target / "SHA256SUMS").read_bytes() == first
    (target / "notes.md").write_text("mine")
    with pytest.raises(BadInput, match="holds 'notes.md', which no export"):
        export_run(RUN, root=root, out=link, force=True)
    assert (target / "notes.md").read_text() == "mine"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(BadInput, match=f"--out {loop} is a link that leads back to itself"):
        export_run(RUN, root=root, out=loop, force=True)
    assert loop.is_symlink()


def test_the_command_prints_one_line_errors(project, monkeypatch, capsys):
    root, _, _ = project
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as exit_:
        run_stage(lambda: main(["--run", BASELINE]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and f"train_cls@{BASELINE}" in err


def test_a_baseline_on_timms_own_deit_exports_without_claiming_timms_weights(project, tmp_path):
    root, _, _ = project
    run = cls_run(load_params(root / "params.yaml"), BASELINE)
    torch.manual_seed(1)
    model = ClassifierSpec.for_run(run).create(num_classes=NUM_CLASSES).eval()
    seed_dir = root / run.paths.seed_dir(1)
    seed_dir.mkdir(parents=True)
    try:
        save_tensors(seed_dir / WEIGHTS, model.state_dict())  # as train_cls writes it, with its digest
        folder = export_run(BASELINE, seed=1, root=root, out=tmp_path / "mhsa")
    finally:
        shutil.rmtree(seed_dir)
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "deit_tiny_patch16_224" and "tag" not in config["pretrained_cfg"]
    rebuilt = timm.create_model(config["architecture"], **config["model_args"]).eval()
    load_checkpoint(rebuilt, str(folder / WEIGHTS), strict=True)
    x = images(model)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))
    card = (folder / "README.md").read_text()
    assert "| DeiT-T MHSA (baseline) | 72.2 [A] | final | `top1` 91.33 ± 4.04 (n=3) |" in card
    assert "Gain over the baseline" not in card  # it is the baseline


def test_a_full_disk_leaves_no_export_and_no_temporary_folder(project, small_disk):
    from vcarepro.core.errors import DiskFull

    root, _, _ = project
    small_disk.fill()
    with pytest.raises(DiskFull, match="no space is left on the device while writing"):
        export_run(RUN, root=root, out=small_disk.path / "export")
    assert small_disk.files() == {} and {p.name for p in small_disk.path.iterdir()} <= {"filler"}
