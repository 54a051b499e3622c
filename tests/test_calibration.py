"""Calibration against released checkpoints (issue 22): the stand-ins, the strict loading, the stage and the report.

The released layouts (tests/data/released_layouts) and the key maps are held to each other in
test_released_layouts_*.py; here the pipeline around them: the stand-ins the smoke scale writes are exactly the
recorded layouts, a released classifier's 1000-way head is read with ImageNet's class indices, and every failure
a user meets (a missing file, a file with pickled objects, a wrong file, a selection at embedded scale) is one
sentence and exit status 2 with no output written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest
import torch

from helpers import one_error_line, prepared, smoke_params, stage  # noqa: F401  (prepared: fixtures)
from vcarepro.calibration import entries, keymap_for, keymaps, load_strict, read_released, verdict
from vcarepro.calibration.run import ImageNetLabels
from vcarepro.core.errors import USER_ERROR_STATUS, BadInput
from vcarepro.data.folders import ClassInfo
from vcarepro.params.config import compose
from vcarepro.report.calibration import calibration_section
from vcarepro.tools.standins import write_released_checkpoints

LAYOUTS = Path(__file__).parent / "data" / "released_layouts"
PAPER = compose(["scale=paper"])["calibrate"]


def recorded(layout: str):
    return json.loads((LAYOUTS / f"{layout}.json").read_text())


def one(calibrate, *names):
    """``calibrate`` with only the named entries."""
    return {
        **calibrate,
        **{group: {n: e for n, e in calibrate[group].items() if n in names} for group in ("classifiers", "generators")},
    }


def test_every_entry_names_a_keymap_and_a_recorded_layout_and_where_to_get_its_file():
    for kind in ("cls", "gen"):
        for name, entry in entries(PAPER, kind).items():
            assert entry["layout"] in keymaps(), name
            assert (LAYOUTS / f"{entry['layout']}.json").is_file(), name
            assert entry["where"] and entry["file"] and entry["tolerance"] > 0, name
    assert set(PAPER["classifiers"]) == {
        "deit_tiny",
        "deit_small",
        "swin_tiny",
        "pvt_tiny",
        "cswin_tiny",
        "agent_deit_tiny",
        "inline_deit_tiny",
        "circulant_deit_tiny",
    }
    # the numbers as their authors print them (READMEs; DiT's 9.62 from its paper)
    assert (
        PAPER["generators"]["dit_xl2_cfg15"]["fid"],
        PAPER["generators"]["dit_xl2_cfg10"]["fid"],
        PAPER["generators"]["sit_xl2"]["fid"],
    ) == (2.27, 9.62, 2.06)
    assert PAPER["classifiers"]["deit_tiny"]["top1"] == 72.2 and PAPER["classifiers"]["swin_tiny"]["top1"] == 81.2


@pytest.mark.parametrize("name", ["deit_tiny", "swin_tiny", "pvt_tiny", "cswin_tiny", "agent_deit_tiny"])
def test_a_stand_in_is_the_recorded_released_layout_in_its_container(tmp_path, name, one_torch_thread):
    entry = PAPER["classifiers"][name]
    (path,) = write_released_checkpoints(tmp_path, one(PAPER, name))
    saved = torch.load(path, map_location="cpu", weights_only=True)
    layout = recorded(entry["layout"])
    state = saved[layout["container"]] if layout["container"] else saved
    assert [(k, list(v.shape)) for k, v in state.items()] == [(k, s) for k, s in layout["keys"].items()]


def test_the_smoke_generators_are_dit_s2_in_the_released_layout(tmp_path, one_torch_thread):
    smoke = compose(["scale=smoke"])["calibrate"]
    files = write_released_checkpoints(tmp_path, one(smoke, "dit_xl2_cfg15", "dit_xl2_cfg10"))
    assert [p.name for p in files] == ["DiT-XL-2-256x256.pt"]  # one file behind both guidance scales
    state = torch.load(files[0], map_location="cpu", weights_only=True)
    assert {k: list(v.shape) for k, v in state.items()} == recorded("dit_s2")["keys"]


def test_a_file_holding_python_objects_is_refused_unless_trusted(tmp_path, one_torch_thread):
    entry = PAPER["classifiers"]["deit_tiny"]
    (path,) = write_released_checkpoints(tmp_path, one(PAPER, "deit_tiny"))
    state = torch.load(path, weights_only=True)["model"]
    torch.save({"model": state, "args": argparse.Namespace(lr=5e-4)}, path)  # as DeiT's own checkpoints hold
    keymap = keymap_for(entry, "deit_tiny")
    with pytest.raises(BadInput, match=r"holds Python objects besides tensors .*calibrate\.trust_pickle=true"):
        read_released(path, keymap, trust_pickle=False)
    assert set(read_released(path, keymap, trust_pickle=True)[1]) == set(state)


def test_a_file_of_another_layout_is_one_sentence_counting_what_differs(tmp_path, one_torch_thread):
    from vcarepro.models import create_classifier

    entry = PAPER["classifiers"]["deit_tiny"]
    (path,) = write_released_checkpoints(tmp_path, one(PAPER, "deit_tiny"))
    keymap = keymap_for(entry, "deit_tiny")
    state = read_released(path, keymap, trust_pickle=False)[1]
    state.pop("blocks.3.attn.qkv.bias")
    state["head.weight"] = state["head.weight"][:10]
    with pytest.raises(
        BadInput,
        match=r"does not have the released layout of deit_tiny: 1 keys missing "
        r"\(blocks\.3\.attn\.qkv\.bias\); 1 shapes differ \(head\.weight\)",
    ):
        load_strict(create_classifier("deit_tiny", "mhsa"), state, keymap, "deit_tiny", path)


class _Split:
    def __init__(self, classes, labels):
        self.classes, self.labels = classes, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return torch.zeros(1), self.labels[i]


def test_labels_are_read_as_imagenets_class_indices():
    from timm.data import ImageNetInfo

    names = ImageNetInfo().label_names()
    split = _Split([ClassInfo(0, names[7], "a"), ClassInfo(1, names[999], "b")], [1, 0, 1])
    assert [ImageNetLabels(split)[i][1] for i in range(3)] == [999, 7, 999]
    with pytest.raises(BadInput, match="not ImageNet-1K synsets"):
        ImageNetLabels(_Split([ClassInfo(0, "n99999999", "digit")], [0]))


@pytest.mark.slow
def test_a_released_head_is_read_with_imagenet_indices_through_the_stage(tmp_path, prepared, one_torch_thread):  # noqa: F811
    """The whole classifier path on ImageNet prepared by prepare_cls: a stand-in DeiT-T whose head always answers
    the ImageNet index of one prepared class scores exactly that class's share of val (2 of 8 images)."""
    import shutil

    from timm.data import ImageNetInfo

    from vcarepro.data.folders import read_classes

    shutil.copytree(prepared / "data", tmp_path / "data")
    params = smoke_params()
    params["calibrate"].update(checkpoints=["deit_tiny"])  # dir: data/smoke/released, as the smoke scale's
    (path,) = write_released_checkpoints(
        tmp_path / "data" / "smoke" / "released", one(params["calibrate"], "deit_tiny")
    )
    target = ImageNetInfo().label_names().index(read_classes(tmp_path / "data" / "cls")[2].wnid)
    saved = torch.load(path, weights_only=True)
    saved["model"]["head.weight"].zero_()
    saved["model"]["head.bias"].zero_()
    saved["model"]["head.bias"][target] = 10.0
    torch.save(saved, path)
    result = stage(tmp_path, "calibrate.py", "--kind", "cls", params=params)
    assert result.returncode == 0, result.stderr
    out = json.loads((tmp_path / "metrics" / "calibration_cls.json").read_text())
    (row,) = out["rows"]
    assert (row["ours"], row["val_images"], row["verdict"]) == (25.0, 8, "not judged")
    assert row["difference"] == pytest.approx(25.0 - 72.2) and row["crop_pct"] == 0.875
    assert {r["name"] for r in out["not_run"]} == set(params["calibrate"]["classifiers"]) - {"deit_tiny"}


@pytest.mark.slow
def test_a_missing_file_is_one_sentence_naming_where_to_get_it_and_writes_nothing(tmp_path):
    params = compose(["scale=paper", "calibrate.checkpoints=[deit_tiny,swin_tiny]"])
    (tmp_path / "data" / "released").mkdir(parents=True)
    write_released_checkpoints(tmp_path / "data" / "released", one(params["calibrate"], "deit_tiny"))
    result = stage(tmp_path, "calibrate.py", "--kind", "cls", params=params)
    assert result.returncode == USER_ERROR_STATUS
    line = one_error_line(result)  # found before deit_tiny (present) is evaluated
    assert "swin_tiny_patch4_window7_224.pth" in line and "github.com/SwinTransformer/storage" in line
    assert "data/released/" in line
    assert not (tmp_path / "metrics" / "calibration_cls.json").exists()


@pytest.mark.slow
def test_embedded_scale_lists_every_entry_as_not_run_and_refuses_a_selection(tmp_path):
    result = stage(tmp_path, "calibrate.py", "--kind", "gen", params=compose([]))
    assert result.returncode == 0, result.stderr
    out = json.loads((tmp_path / "metrics" / "calibration_gen.json").read_text())
    assert out["rows"] == [] and {r["name"] for r in out["not_run"]} == {"dit_xl2_cfg15", "dit_xl2_cfg10", "sit_xl2"}
    assert out["not_run"][0]["where"].startswith("https://dl.fbaipublicfiles.com/DiT/")
    (tmp_path / "metrics" / "calibration_gen.json").unlink()
    params = compose(["calibrate.checkpoints=[dit_xl2_cfg15]"])
    result = stage(tmp_path, "calibrate.py", "--kind", "gen", params=params)
    assert result.returncode == USER_ERROR_STATUS and "scale=paper" in one_error_line(result)
    params = compose(["calibrate.checkpoints=[deit_tinny]"])
    result = stage(tmp_path, "calibrate.py", "--kind", "gen", params=params)
    assert result.returncode == USER_ERROR_STATUS and "'deit_tinny'" in one_error_line(result)
    assert not (tmp_path / "metrics" / "calibration_gen.json").exists()


def test_a_verdict_is_given_only_for_the_published_protocol_at_paper_scale_and_follows_the_tolerance():
    assert verdict("paper", -0.3, 0.3) == "reproduces" and verdict("paper", 0.31, 0.3) == "does not reproduce"
    assert verdict("smoke", 0.0, 0.3) == "not judged" and verdict("embedded", 0.0, 0.3) == "not judged"
    assert verdict("paper", 0.0, 0.3, ["1,000 samples, not FID-50K's 50,000"]) == "not judged"
    assert verdict("paper", float("nan"), 0.3) == "not a finite number"


def test_a_file_whose_digest_is_not_the_published_one_is_refused(tmp_path, one_torch_thread):
    from vcarepro.calibration import check_digest

    entry = PAPER["classifiers"]["deit_tiny"]
    (path,) = write_released_checkpoints(tmp_path, one(PAPER, "deit_tiny"))  # random weights: another digest
    with pytest.raises(
        BadInput,
        match=r"has sha256 [0-9a-f]{16}\.\.\., but the file released for calibration "
        r"entry deit_tiny has a1311bcf\.\.\.; download it again from https://",
    ):
        check_digest(path, entry, "deit_tiny")
    assert len(check_digest(path, {**entry, "sha256": None}, "deit_tiny")) == 64


def test_a_full_digest_is_checked_whole_and_a_prefix_only_with_a_warning_line(tmp_path, capsys):
    from vcarepro.calibration import check_digest

    path = tmp_path / "released.pth"
    path.write_bytes(b"released weights")
    digest = hashlib.sha256(b"released weights").hexdigest()
    entry = {**PAPER["classifiers"]["deit_tiny"], "sha256": digest}
    assert check_digest(path, entry, "deit_tiny") == digest and capsys.readouterr().err == ""  # full: silent
    with pytest.raises(BadInput, match="has sha256 .* but the file released for calibration entry deit_tiny"):
        check_digest(path, {**entry, "sha256": digest[:63] + ("0" if digest[63] != "0" else "1")}, "deit_tiny")
    assert check_digest(path, {**entry, "sha256": digest[:8]}, "deit_tiny") == digest
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: calibration entry deit_tiny checks only the first 8 hex digits of released.pth")
    assert "(32 bits)" in line and "not against tampering" in line and digest in line
    for bad in ("a131", "a1311bcg", digest + "0"):  # too short to mean anything, not hex, longer than a sha256
        with pytest.raises(BadInput, match=f"calibration entry deit_tiny has sha256 '{bad}'; give the file's full"):
            check_digest(path, {**entry, "sha256": bad}, "deit_tiny")


def test_weights_found_under_another_container_than_the_released_one_are_not_judged():
    keymap = keymap_for(PAPER["classifiers"]["cswin_tiny"], "cswin_tiny")
    state = {"w": torch.zeros(1)}
    assert keymap.find({"state_dict_ema": state, "state_dict": {}}) == ("state_dict_ema", state)
    assert keymap.find({"state_dict": state}) == ("state_dict", state)
    assert keymap.released_container() == "state_dict_ema"


@pytest.mark.slow
def test_a_selection_twice_or_a_directory_dvc_does_not_track_is_refused(tmp_path):
    params = compose(["scale=paper", "calibrate.checkpoints=[deit_tiny,deit_tiny]"])
    result = stage(tmp_path, "calibrate.py", "--kind", "cls", params=params)
    assert result.returncode == USER_ERROR_STATUS and "more than once" in one_error_line(result)
    params = compose(["scale=paper", "calibrate.checkpoints=[deit_tiny]", "calibrate.dir=/somewhere/else"])
    result = stage(tmp_path, "calibrate.py", "--kind", "cls", params=params)
    assert result.returncode == USER_ERROR_STATUS and "put the files in data/released" in one_error_line(result)
    assert not (tmp_path / "metrics").exists()


def test_the_report_section_shows_rows_folds_what_was_not_run_and_leaves_out_another_scales(tmp_path):
    (tmp_path / "metrics").mkdir()
    row = {
        "name": "deit_tiny",
        "kind": "cls",
        "metric": "top1",
        "published": 72.2,
        "ours": 72.14,
        "difference": -0.06,
        "tolerance": 0.3,
        "verdict": "reproduces",
        "source": "facebookresearch/deit README",
        "file": "x.pth",
        "sha256": "ab" * 32,
        "standin": False,
        "deviations": [],
        "val_images": 50000,
    }
    missing = [{"name": "swin_tiny", "file": "swin_tiny_patch4_window7_224.pth"}]
    (tmp_path / "metrics" / "calibration_cls.json").write_text(
        json.dumps({"scale": "paper", "rows": [row], "not_run": missing})
    )
    (tmp_path / "metrics" / "calibration_gen.json").write_text(
        json.dumps({"scale": "smoke", "rows": [row], "not_run": []})
    )
    section = calibration_section(tmp_path, "paper")
    (shown,) = section["rows"]
    assert (shown["ours"], shown["difference"], shown["tolerance"], shown["note"]) == ("72.14", "-0.06", "±0.3", "")
    assert section["files"] == ["swin_tiny_patch4_window7_224.pth"]
    assert section["stale"] == ["metrics/calibration_gen.json (scale smoke)"]


# timm's own deit_* / swin_tiny cfgs say crop_pct 0.9 (timm's convention); DeiT's and Swin's code evaluate at
# 0.875 (Resize 256, CenterCrop 224), which the deit / swin recipes follow. The others' cfgs are ours.
OWN_CFGS = sorted(set(PAPER["classifiers"]) - {"deit_tiny", "deit_small", "swin_tiny"})


@pytest.mark.parametrize("name", OWN_CFGS)
def test_each_models_timm_data_config_evaluates_as_the_calibration_recipe(name, one_torch_thread):
    """timm's resolve_data_config of our model (what a timm user evaluates it with) and the recipe the calibration
    evaluates the released weights with agree on the eval resize, crop and interpolation."""
    import timm.data

    from vcarepro.models import create_classifier

    entry = PAPER["classifiers"][name]
    config = timm.data.resolve_data_config({}, model=create_classifier(entry["arch"], entry["attention"]))
    recipe = compose(["scale=paper"])["cls_recipes"][entry["recipe"]]
    assert (
        config["crop_pct"],
        config.get("crop_mode", "center"),
        config["interpolation"],
        config["input_size"][-1],
    ) == (recipe["crop_pct"], recipe["crop_mode"], recipe["interpolation"], recipe["img_size"])


@pytest.mark.parametrize(
    "name, saved_under, deviates",
    [
        ("cswin_tiny", "state_dict_ema", False),
        ("cswin_tiny", "state_dict", True),
        ("pvt_tiny", "model", False),
        ("pvt_tiny", None, False),
        ("deit_tiny", None, False),
    ],
)
def test_only_a_fallback_container_of_other_weights_is_a_deviation(
    tmp_path, name, saved_under, deviates, one_torch_thread
):
    from vcarepro.calibration.run import load_released
    from vcarepro.models import create_classifier

    cal = {**one(PAPER, name), "dir": str(tmp_path)}
    entry = {**cal["classifiers"][name], "sha256": None}
    cal["classifiers"][name] = entry
    (path,) = write_released_checkpoints(tmp_path, cal)
    state = keymap_for(entry, name).unwrap(torch.load(path, weights_only=True))
    torch.save(state if saved_under is None else {saved_under: state}, path)
    _, _, _, deviations = load_released(create_classifier(entry["arch"], "mhsa"), cal, name, entry)
    assert bool(deviations) == deviates and all("state_dict" in d for d in deviations)
