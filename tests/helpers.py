"""What the tests share: the repository root, the micro DVC repositories and their shell, the stage runner, the
tiny training driver, the report's project tree and the smoke scale's prepared ImageNet. Test files import from here,
never from each other."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import pytest
import torch
import yaml
from safetensors.torch import load_file

from vcarepro.params.config import compose
from vcarepro.params.provenance import write_provenance

ROOT = Path(__file__).resolve().parents[1]


CLS_RUNS = ["deit_tiny-mhsa", "deit_tiny-vca"]


GEN_RUNS = ["dit_s2-vca", "sit_s2-mhsa"]


def micro_params(
    overrides: Sequence[str] = (), cls_runs: Sequence[str] = CLS_RUNS, gen_runs: Sequence[str] = GEN_RUNS
) -> dict:
    """The embedded scale (with ``overrides``), shrunk to seconds: the given runs, one seed, a handful of steps."""
    p = compose(list(overrides))
    p["cls_runs"] = {k: {**p["cls_runs"][k], "seeds": [0]} for k in cls_runs}
    p["gen_runs"] = {k: {**p["gen_runs"][k], "seeds": [0]} for k in gen_runs}
    used = {r["model"] for r in [*p["cls_runs"].values(), *p["gen_runs"].values()]}
    # a published variant (models/family.py) goes with its drop-in run
    p["models"] = {k: v for k, v in p["models"].items() if k in used or k.removesuffix("-published") in used}
    p["complexity"]["throughput_batch"] = 0  # FLOPs stay at paper shape, they are cheap
    p["cls_shape"].update(depth=1, embed_dim=32)
    p["cls_recipe_overrides"].update(epochs=1, batch_size=256)
    p["gen_shape"].update(depth=1, hidden_size=32)
    p["gen_recipe"].update(steps=4, log_every=2, ckpt_every=2)
    p["sampling"].update(num_samples=70, batch_size=70, ddpm_steps=3, flow_steps=3)
    p["prepare_gen"]["extractor_epochs"] = 1
    p["attention_cost"].update(sides=[7, 14], min_run_time=0.05)
    return p


def sh(cmd, cwd, check=True, env=None):
    env = {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        **(env or {}),
    }
    result = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


TRAIN_DRIVER = ROOT / "tests" / "train_driver.py"
TRAINED = {"cls": "model.safetensors", "gen": "model_ema.safetensors"}  # what the driver writes in WORKDIR/out


def train_tiny(branch: str, workdir: Path, seed: int = 0) -> str:
    """tests/train_driver.py run to its end in its own process; what it printed."""
    run = subprocess.run(
        [sys.executable, str(TRAIN_DRIVER), branch, str(workdir), str(seed)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def same_weights(path: Path, expected: dict) -> bool:
    got = load_file(str(path))
    return got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in expected)


def stage_names(params: dict) -> set:
    names = {
        "check_params",
        "smoke_inputs",
        "prepare_cls",
        "prepare_gen",
        "fid_reference",
        "complexity",
        "attention_cost",
        "cls_reference",
        "calibrate_cls",
        "calibrate_gen",
        "report",
    }
    names |= {f"{s}@{r}" for s in ("train_cls", "eval_cls") for r in params["cls_runs"]}
    names |= {f"{s}@{r}" for s in ("train_gen", "sample_gen", "eval_gen") for r in params["gen_runs"]}
    return names


def copied_project(repo: Path) -> Path:
    """This project's tracked files (no outputs) in ``repo``."""
    tracked = sh("git ls-files --cached --others --exclude-standard", ROOT).stdout.split()
    outputs = (
        "runs/",
        "reports/",
        "metrics/",
        "checkpoints/",
        "data/cls",
        "data/gen",
        "data/fid_reference",
        "data/smoke",
        "data/params.checked",
        "dvc.lock",
    )
    for rel in tracked:
        if (ROOT / rel).is_file() and not rel.startswith(outputs):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    return repo


def reproduced_repo(repo: Path, params: dict, targets: str = "", first: Sequence[Tuple[str, str]] = ()) -> Path:
    """This project's tracked files (no outputs) with ``params`` in a new git repository, after `dvc repro`
    (of ``targets`` and what they depend on; every stage without). ``first``: (target, path) pairs reproduced
    one at a time before that, each followed by the removal of ``path`` (a run's resume checkpoints, which no
    stage reads, so that they do not pile up on the disk)."""
    copied_project(repo)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm micro", repo)
    for target, removed in first:
        sh(f"dvc repro {target}", repo)
        shutil.rmtree(repo / removed)
    out = sh(f"dvc repro {targets}".strip(), repo).stdout
    (repo.parent / "repro.out").write_text(out)  # what `dvc repro` printed, beside the repository
    return repo


def stage(tmp_path, script, *args, params=None):
    """Run ``stages/<script>`` with ``params`` as params.yaml in an empty project directory."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params or compose([])))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, str(ROOT / "stages" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error_line(result) -> str:
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:") or "params.yaml:" in line]
    assert len(lines) == 1, result.stderr
    return lines[0]


def read_floors(src: Path, package: str) -> Dict[str, Optional[int]]:
    """Each folder of ``package`` -> the ``FLOOR = N`` its ``__init__.py`` declares (None: none), read with ast."""
    floors: Dict[str, Optional[int]] = {}
    for init in sorted((src / package).glob("*/__init__.py")):
        values = [
            node.value.value
            for node in ast.parse(init.read_text()).body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == "FLOOR" for t in node.targets)
        ]
        floors[f"{package}.{init.parent.name}"] = values[0] if values else None
    return floors


def pooled_queries(q_patches: torch.Tensor, grid, contrast) -> torch.Tensor:
    """Adaptive average pooling written out: token (i, j) is the mean of rows floor(iH/h)..ceil((i+1)H/h)-1
    and columns floor(jW/w)..ceil((j+1)W/w)-1 of the row-major patch grid."""
    (H, W), (h, w) = grid, contrast
    cells = q_patches.reshape(q_patches.shape[0], H, W, -1)
    out = []
    for i in range(h):
        rows = slice(math.floor(i * H / h), math.ceil((i + 1) * H / h))
        for j in range(w):
            cols = slice(math.floor(j * W / w), math.ceil((j + 1) * W / w))
            out.append(cells[:, rows, cols].mean(dim=(1, 2)))
    return torch.stack(out, dim=1)


def attention_path(m: torch.nn.Module, fused: bool) -> torch.nn.Module:
    """``m`` with timm's fused attention on (SDPA) or off (each map materialised), as TIMM_FUSED_ATTN=0 builds it."""
    m.fused_attn = fused
    return m


def vouch(project, branch, run):
    """The run's provenance.json as its evaluation stage writes it: produced by the project's params."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    write_provenance(params, branch, run, project / "runs" / branch / run)


@pytest.fixture
def project(tmp_path):
    """A project tree with embedded params, a few run results and one hostile string in the params."""
    for rel in ("conf", "data/paper_reference.yaml"):
        src = ROOT / rel
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / rel)
    params = compose([])
    # run names are a safe alphabet now (the schema), but other strings reach the page: the report escapes them
    params["prepare_cls"]["imagenet_root"] = "<script>alert(1)</script>"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "complexity.json").write_text(
        json.dumps(
            {
                "deit_tiny-mhsa": {"params_m": 5.717, "gmacs": 1.254},
                "deit_tiny-vca": {"params_m": 5.974, "gmacs": 1.257},
            }
        )
    )
    run = tmp_path / "runs" / "cls" / "deit_tiny-vca"
    (run / "live" / "plots" / "metrics" / "seed_0" / "train").mkdir(parents=True)
    (run / "live" / "plots" / "metrics" / "seed_0" / "train" / "loss.tsv").write_text(
        "timestamp\tstep\tloss\n0\t1\t2.0\n0\t2\t1.5\n"
    )
    (run / "metrics.json").write_text(
        json.dumps(
            {
                "top1": 88.25,
                "top1_std": 1.5,
                "top1_seed0": 87.2,
                "top1_seed1": 89.3,
                "n_seeds": 2,
                "top5": 99.0,
                "top5_std": 0.1,
                "loss": 0.4,
                "loss_std": 0.01,
                "top1_best": 90.5,
                "top1_best_std": 0.5,
            }
        )
    )
    vouch(tmp_path, "cls", "deit_tiny-vca")
    return tmp_path


def add_vca_and_baseline(project, base_top1=60.0, vca_top1=(62.0, 66.0)):
    """DeiT-T baseline (two seeds, 58 and 62) beside the VCA run of the fixture, and an attention_cost file."""
    run = project / "runs" / "cls" / "deit_tiny-mhsa"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(
        json.dumps(
            {
                "top1": base_top1,
                "top1_std": 2.83,
                "top1_seed0": base_top1 - 2,
                "top1_seed1": base_top1 + 2,
                "n_seeds": 2,
            }
        )
    )
    vouch(project, "cls", "deit_tiny-mhsa")
    rows = [
        {"tokens": n, "layer": layer, "forward_ms": 1.0, "forward_backward_ms": t, "macs": m}
        for n, layer, t, m in [
            (196, "mhsa", 1.0, 100),
            (3136, "mhsa", 300.0, 25600),
            (196, "vca", 1.0, 100),
            (3136, "vca", 16.0, 1600),
        ]
    ]
    # the stage's output (exact MACs) and, outside every DVC output, the times measured with it
    (project / "metrics" / "attention_macs.json").write_text(
        json.dumps({"config": {}, "rows": [{k: r[k] for k in ("layer", "tokens", "macs")} for r in rows]})
    )
    (project / "timings").mkdir(exist_ok=True)
    (project / "timings" / "attention_cost.json").write_text(
        json.dumps({"machine": {"cpu": "Test CPU"}, "config": {}, "rows": rows})
    )


def write_seeds(project, branch, run, metric, seeds):
    path = project / "runs" / branch / run
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(
        json.dumps(
            {
                metric: statistics.fmean(seeds),
                f"{metric}_std": statistics.stdev(seeds) if len(seeds) > 1 else 0.0,
                "n_seeds": len(seeds),
                **{f"{metric}_seed{i}": v for i, v in enumerate(seeds)},
            }
        )
    )
    vouch(project, branch, run)


# DeiT's layout at 32 px (patch 16 -> a 2x2 grid), so that a stage trains in seconds
TINY_DEIT = {"img_size": 32, "depth": 1, "embed_dim": 32, "num_heads": 2, "contrast_tokens": 1}


def smoke_params(**overrides):
    """The smoke scale's params, every classification run trained by tiny DeiT-T models at 32 px."""
    params = compose(["scale=smoke"])
    params["cls_shape"] = dict(TINY_DEIT)
    # the DeiT runs alone: cls_shape goes to every run's constructor, and the hierarchical ones take no depth
    params["cls_runs"] = {
        k: v for k, v in params["cls_runs"].items() if params["models"][v["model"]]["arch"].startswith("deit")
    }
    params["cls_recipe_overrides"].update({"img_size": 32, "workers": 0, **overrides})
    return params


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """data/cls prepared by the real prepare_cls stage from a miniature in the official archive layout."""
    from vcarepro.tools.standins import write_mini_imagenet

    work = tmp_path_factory.mktemp("road")
    write_mini_imagenet(work / "ilsvrc", classes=4, train_per_class=4, val_per_class=2, seed=0)
    params = smoke_params()
    params["prepare_cls"].update(imagenet_root=str(work / "ilsvrc"), workers=1)
    result = stage(work, "prepare_cls.py", params=params)
    assert result.returncode == 0, result.stderr
    return work


def conf_copy(where: Path, edit=None) -> Path:
    """A copy of conf/ and of the committed params.yaml in ``where``; ``edit(text of a conf file) -> text``."""
    where.mkdir(parents=True)
    shutil.copytree(ROOT / "conf", where / "conf")
    shutil.copyfile(ROOT / "params.yaml", where / "params.yaml")
    if edit:
        path, old, new = edit
        text = (where / path).read_text()
        assert text.count(old) == 1, old
        (where / path).write_text(text.replace(old, new))
    return where


def load_stage(name):
    """A stage script of stages/ as a module, its functions callable in this process."""
    spec = importlib.util.spec_from_file_location(f"stage_{name}", ROOT / "stages" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the hierarchical backbones at 64 px, one or two blocks a stage (tests/test_timm_hierarchical.py)
PVT, SWIN, CSWIN = dict(depths=(1, 1, 1, 1)), dict(depths=(1, 1, 2, 1), window_size=2), dict(depths=(1, 1, 1, 1))
SMALL_TOKENS = (9, 16, 4, 1)  # contrast / agent tokens that fit the 16/8/4/2 stage grids
# every registered hierarchical model of this project, at its small shape (lab_* with its default attention)
SMALL = {
    "pvt_tiny": PVT,
    "pvt_tiny_gap": PVT,
    "vca_pvt_tiny": dict(**PVT, contrast_tokens=SMALL_TOKENS),
    "lab_pvt_tiny": dict(**PVT, contrast_tokens=SMALL_TOKENS),
    "vca_swin_tiny_patch4_window7_224": dict(**SWIN, contrast_tokens=SMALL_TOKENS),
    "lab_swin_tiny_patch4_window7_224": dict(**SWIN, contrast_tokens=SMALL_TOKENS),
    "cswin_tiny_224": CSWIN,
    "cswin_tiny_2418_224": CSWIN,
    "vca_cswin_tiny_224": dict(**CSWIN, contrast_tokens=SMALL_TOKENS),
    "lab_cswin_tiny_224": dict(**CSWIN, contrast_tokens=SMALL_TOKENS),
}


def flat_jpeg(width: int, height: int) -> bytes:
    """A decodable grayscale JPEG of ``width`` x ``height``, every 8x8 block flat grey: 6 bits a block (DC difference
    0, then end of block, in the standard Huffman tables), so 13000 x 13000 pixels are 2 MB, built in a blink."""
    import io
    import struct

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8), 128).save(buf, "JPEG")
    data = buf.getvalue()
    sof = data.index(b"\xff\xc0")
    data = data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]
    sos = data.index(b"\xff\xda")
    head = data[: sos + 2 + struct.unpack(">H", data[sos + 2 : sos + 4])[0]]
    bits = "001010" * (-(-width // 8) * -(-height // 8))
    bits += "1" * (-len(bits) % 8)  # padded with ones, as JPEG pads
    return head + int(bits, 2).to_bytes(len(bits) // 8, "big") + b"\xff\xd9"
