"""The files from outside the repository that the selected runs need (ImageNet, the SD-VAE, the Inception weights,
the ADM reference batch), as params name them, and one sentence for each missing one, however many params name it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from vcarepro.tools.preflight.sizing import standins


@dataclass
class Input:
    name: str
    param: str
    path: str
    present: bool
    fix: str = ""  # what to do; {param} stands for the param(s) naming this input
    generated: bool = False  # a stand-in the pipeline makes itself (smoke scale): missing is not a problem
    stages: Tuple[str, ...] = ()  # the stages that read it
    runs: int = 0  # how many of the selected runs need it
    where: str = ""  # where it was looked for, when not simply at its path

    def line(self) -> str:
        return input_line([self])


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def group_inputs(inputs: Sequence[Input]) -> List[List[Input]]:
    """The inputs by what they are (name and path): the SD-VAE that prepare_gen.vae and sampling.vae_decoder both
    name is one input, read twice."""
    groups: Dict[tuple, List[Input]] = {}
    for entry in inputs:
        groups.setdefault((entry.name, str(entry.path)), []).append(entry)
    return list(groups.values())


def input_line(group: Sequence[Input]) -> str:
    first = group[0]
    state = (
        "present"
        if first.present
        else ("not generated yet (dvc repro smoke_inputs makes it)" if first.generated else "MISSING")
    )
    return f"{first.name} ({_and([i.param for i in group])} = {first.path}): {state}"


def missing_input_sentence(group: Sequence[Input]) -> str:
    """One sentence for a missing input, however many params name it: what, who reads it, where it was looked for,
    and the fix."""
    first = group[0]
    params = _and([i.param for i in group])
    stages = _and(list(dict.fromkeys(stage for i in group for stage in i.stages)))
    runs = max(i.runs for i in group)
    label = f"{first.name} {first.path}" if first.where else first.name
    where = first.where or f"at {first.path}"
    needed = f", read by {stages}" if stages else ""
    needed += f"; {runs} selected run{'s' if runs != 1 else ''} need{'s' if runs == 1 else ''} it" if runs else ""
    return f"{label} ({params}{needed}): not found {where}; fix: {first.fix.format(param=params)}."


def missing_inputs(inputs: Sequence[Input]) -> List[str]:
    return [
        missing_input_sentence(group)
        for group in group_inputs(inputs)
        if not group[0].present and not group[0].generated
    ]


def check_inputs(params: Dict[str, Any], *, cls_runs: int, gen_runs: int, cls_prepared: bool) -> List[Input]:
    """The files from outside the repository that the selected runs (``cls_runs`` and ``gen_runs`` of each branch)
    need, as params name them: one entry per param, so an input two params name comes twice (see
    :func:`group_inputs`)."""
    from vcarepro.data.latents import _local_vae_folder
    from vcarepro.metrics.digit_features import INCEPTION_WEIGHTS_FILENAME

    inputs: List[Input] = []
    prep = params["prepare_cls"]
    if prep["source"] == "imagenet" and not cls_prepared and (cls_runs or gen_runs):
        root = prep["imagenet_root"]
        # prepare_gen makes its latents or pixels from data/cls, so every generation run needs ImageNet too
        inputs.append(
            Input(
                "ImageNet root",
                "prepare_cls.imagenet_root",
                root,
                Path(root).is_dir(),
                "set prepare_cls.imagenet_root to the folder holding ILSVRC2012_img_train.tar or "
                "train/ (dvc exp run -S prepare_cls.imagenet_root=/path)",
                stages=("prepare_cls", "prepare_gen") if gen_runs else ("prepare_cls",),
                runs=cls_runs + gen_runs,
            )
        )
    if not gen_runs:
        return inputs
    gen = params["prepare_gen"]
    vaes = {}
    if gen["source"] == "vae_latents":
        vaes[("prepare_gen.vae", "prepare_gen")] = gen["vae"]
        vaes[("sampling.vae_decoder", "sample_gen")] = params["sampling"]["vae_decoder"]
    if vaes:
        from huggingface_hub.constants import HF_HUB_CACHE
    for (param, stage), name in vaes.items():
        inputs.append(
            Input(
                "SD-VAE",
                param,
                name,
                _local_vae_folder(name) is not None,
                f"on a machine with internet run `huggingface-cli download {name} --local-dir "
                f"weights/{name.rstrip('/').split('/')[-1]}`, copy the folder here and point {{param}} "
                f"at it",
                stages=(stage,),
                runs=gen_runs,
                where=f"as a folder or in the Hugging Face cache ({HF_HUB_CACHE})",
            )
        )
    if gen["fid_extractor"] == "inception":
        path = gen["inception_weights"]
        inputs.append(
            Input(
                "Inception weights",
                "prepare_gen.inception_weights",
                path,
                Path(path).is_file(),
                f"copy {INCEPTION_WEIGHTS_FILENAME} (torch-fidelity's v0.2.0 GitHub release) there",
                stages=("fid_reference", "eval_gen"),
                runs=gen_runs,
            )
        )
    adm = params["fid_reference"].get("adm_npz")
    if adm:
        inputs.append(
            Input(
                "ADM reference batch",
                "fid_reference.adm_npz",
                adm,
                Path(adm).is_file(),
                "download VIRTUAL_imagenet256_labeled.npz from openai/guided-diffusion's evaluations "
                "README on a connected machine and put it there",
                stages=("fid_reference",),
                runs=gen_runs,
            )
        )
    smoke = standins(params)
    if smoke:
        for entry in inputs:
            entry.generated = str(entry.path).startswith(str(smoke["root"]))
    return inputs
