"""Calibration: released weights through this project's own evaluation path, against their authors' numbers.

Each entry of ``calibrate.classifiers`` / ``calibrate.generators`` (conf/config.yaml)
names a released file, the model its key layout maps onto (``keymaps``), its authors'
protocol, the published number and a tolerance; stages ``calibrate_cls`` /
``calibrate_gen`` evaluate those ``calibrate.checkpoints`` lists with eval_cls's and
eval_gen's own code (docs/calibration.md). Every row records the file's sha256; at smoke
scale the files are random stand-ins (``vcarepro.tools.standins``) and are not judged.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path
from typing import Any, Dict, List

import torch

from vcarepro.calibration.keymaps import KeyMap
from vcarepro.core.errors import BadInput, MissingInput, UnknownName
from vcarepro.params.schema import FULL_DIGEST, SHORTEST_PREFIX, is_digest

FLOOR = 5

KINDS = {"cls": "classifiers", "gen": "generators"}
METRIC = {"cls": "top1", "gen": "fid"}


def keymaps() -> Dict[str, KeyMap]:
    """Every released layout this project maps onto its layers, by layout name."""
    from vcarepro.calibration.keymaps import backbones, lab

    return {**backbones.KEYMAPS, **lab.KEYMAPS}


def entries(calibrate: Dict[str, Any], kind: str) -> Dict[str, Dict[str, Any]]:
    return dict(calibrate.get(KINDS[kind]) or {})


def selected(calibrate: Dict[str, Any], kind: str) -> List[str]:
    """The entries of ``kind`` that ``calibrate.checkpoints`` lists; unknown names are refused."""
    chosen = list(calibrate.get("checkpoints") or [])
    twice = sorted({c for c in chosen if chosen.count(c) > 1})
    if twice:
        raise BadInput(f"calibrate.checkpoints lists {', '.join(twice)} more than once; list each entry once.")
    known = {**entries(calibrate, "cls"), **entries(calibrate, "gen")}
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise UnknownName(
            f"calibrate.checkpoints names {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not an entry of calibrate.classifiers or "
            f"calibrate.generators; choose from {', '.join(known)}."
        )
    return [c for c in chosen if c in entries(calibrate, kind)]


def checkpoint_path(calibrate: Dict[str, Any], entry: Dict[str, Any]) -> Path:
    return Path(calibrate["dir"]) / entry["file"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def build_model(kind: str, entry: Dict[str, Any]) -> torch.nn.Module:
    """The model of ours an entry's released weights load into (the calibration and the stand-ins build it here)."""
    if kind == "cls":
        from vcarepro.models import create_classifier

        return create_classifier(entry["arch"], entry["attention"], **(entry.get("options") or {}))
    from vcarepro.models.dit import create_dit

    # ImageNet's 1000 classes, latents of the SD VAE (4 channels, 8x downsampling)
    return create_dit(
        entry["arch"],
        "mhsa",
        input_size=entry["image_size"] // 8,
        in_channels=4,
        num_classes=1000,
        learn_sigma=entry["learn_sigma"],
    )


def read_released(path: Path, keymap: KeyMap, *, trust_pickle: bool):
    """(the container entry the weights were found under, None for a bare file; the state dict in the released
    layout, not yet mapped)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return None, load_file(str(path))
    try:
        saved = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as err:
        raise BadInput(
            f"{path} holds Python objects besides tensors ({str(err).splitlines()[0][:120]}); load it only "
            f"if you trust its source, with calibrate.trust_pickle=true."
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise BadInput(
            f"{path} is not a readable PyTorch checkpoint ({str(err).splitlines()[0][:120]}); download it again."
        ) from None
    container, state = keymap.find(saved)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BadInput(
            f"{path} holds no state dict under {', '.join(keymap.containers) or 'its top level'}; is it "
            f"the released file?"
        )
    return container, state


def check_digest(path: Path, entry: Dict[str, Any], name: str) -> str:
    """The file's sha256, refused when the entry records another. The entry's ``sha256`` is the full digest, or
    the prefix its publisher gives (torch hub's names end in the first 8 hex digits): a prefix is checked with a
    warning line, since 32 bits catch a wrong or damaged download but not a file crafted to match them."""
    digest = sha256(path)
    expected = entry.get("sha256")
    if not expected:
        return digest
    expected = str(expected).lower()
    if not is_digest(expected):
        raise BadInput(
            f"calibration entry {name} has sha256 {expected!r}; give the file's full sha256 ({FULL_DIGEST} hex "
            f"digits) or the prefix its publisher gives ({SHORTEST_PREFIX} or more), or null."
        )
    if not digest.startswith(expected):
        raise BadInput(
            f"{path} has sha256 {digest[:16]}..., but the file released for calibration entry {name} "
            f"has {expected}...; download it again from {entry['where']}."
        )
    if len(expected) < FULL_DIGEST:
        print(
            f"warning: calibration entry {name} checks only the first {len(expected)} hex digits of {path.name}'s "
            f"sha256 ({4 * len(expected)} bits): that guards against a wrong or damaged download, not against "
            f"tampering; once you trust this file, put its full sha256 {digest} in the entry's sha256.",
            file=sys.stderr,
            flush=True,
        )
    return digest


def load_strict(
    model: torch.nn.Module, state: Dict[str, torch.Tensor], keymap: KeyMap, name: str, path: Path
) -> torch.nn.Module:
    """``model`` with the released ``state`` mapped onto it; any key or shape that does not line up is refused."""
    try:
        mapped = keymap.to_ours(state)
    except (KeyError, RuntimeError, ValueError) as err:
        raise BadInput(f"{path} does not have the released layout of {name} ({err}); is it the right file?") from None
    ours = model.state_dict()
    missing = [k for k in ours if k not in mapped]
    unexpected = [k for k in mapped if k not in ours]
    shapes = [k for k in ours if k in mapped and tuple(mapped[k].shape) != tuple(ours[k].shape)]
    if missing or unexpected or shapes:
        problems = [
            f"{len(v)} {what} ({', '.join(v[:3])}{', ...' if len(v) > 3 else ''})"
            for what, v in (("keys missing", missing), ("unexpected keys", unexpected), ("shapes differ", shapes))
            if v
        ]
        raise BadInput(
            f"{path} does not have the released layout of {name}: {'; '.join(problems)}; is it the right file?"
        )
    model.load_state_dict({k: v.to(ours[k].dtype) for k, v in mapped.items()}, strict=True)
    return model.eval()


def missing_file_message(calibrate: Dict[str, Any], name: str, entry: Dict[str, Any]) -> str:
    path = checkpoint_path(calibrate, entry)
    return (
        f"released checkpoint {path} for calibration entry {name} is missing; download {entry['file']} from "
        f"{entry['where']} into {calibrate['dir']}/ (docs/calibration.md)."
    )


def verdict(scale: str, difference: float, tolerance: float, deviations: List[str] = ()) -> str:
    """A verdict only for released weights measured by the published protocol on ImageNet (scale=paper)."""
    if scale != "paper" or deviations:
        return "not judged"  # stand-in weights, a scale whose data is not ImageNet's, or another protocol
    if difference != difference:
        return "not a finite number"
    return "reproduces" if abs(difference) <= tolerance else "does not reproduce"


def row(
    scale: str,
    kind: str,
    name: str,
    entry: Dict[str, Any],
    ours: float,
    path: Path,
    digest: str,
    extra: Dict[str, Any],
    deviations: List[str],
) -> Dict[str, Any]:
    """One calibration row; ``deviations`` says how this measurement's protocol differs from the published one."""
    metric = METRIC[kind]
    published = float(entry[metric])
    difference = ours - published
    return {
        "name": name,
        "kind": kind,
        "metric": metric,
        "published": published,
        "ours": ours,
        "difference": difference,
        "tolerance": float(entry["tolerance"]),
        "verdict": verdict(scale, difference, float(entry["tolerance"]), deviations),
        "deviations": deviations,
        "source": entry["source"],
        "file": str(path),
        "sha256": digest,
        "standin": scale == "smoke",
        **extra,
    }


def not_run(calibrate: Dict[str, Any], kind: str, chosen: List[str]) -> List[Dict[str, Any]]:
    """The entries not evaluated: what to download, from where, and the number each must reproduce."""
    return [
        {
            "name": n,
            "kind": kind,
            "metric": METRIC[kind],
            "published": float(e[METRIC[kind]]),
            "tolerance": float(e["tolerance"]),
            "file": e["file"],
            "where": e["where"],
            "source": e["source"],
        }
        for n, e in entries(calibrate, kind).items()
        if n not in chosen
    ]


def require_file(calibrate: Dict[str, Any], name: str, entry: Dict[str, Any]) -> Path:
    path = checkpoint_path(calibrate, entry)
    if not path.is_file():
        raise MissingInput(missing_file_message(calibrate, name, entry))
    return path


def keymap_for(entry: Dict[str, Any], name: str) -> KeyMap:
    maps = keymaps()
    if entry["layout"] not in maps:
        raise UnknownName(
            f"calibration entry {name} names layout {entry['layout']!r}, which vcarepro.calibration."
            f"keymaps does not know; choose one of {', '.join(maps)}."
        )
    return maps[entry["layout"]]
