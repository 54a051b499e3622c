"""The protocol a FID followed, known in one place: how the samples were made and measured.

``sample_gen`` writes the protocol it followed (:func:`sampling_protocol`: sampler and steps,
guidance, labels, decoder, the training precision) as ``protocol.json`` beside the samples;
``eval_gen`` copies it into ``metrics.json`` with the reference statistics it measured against;
the report compares it with the paper's (``fid_protocol`` in data/paper_reference.yaml,
:func:`deviations`) and words the paper's and ours with one formatter (:func:`describe`).
Torch-free: the report imports it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from vcarepro.core.choices import FLOW_SAMPLERS
from vcarepro.core.errors import BadInput, MissingInput

PROTOCOL_FILE = "protocol.json"  # in runs/gen/<run>/samples/, written by sample_gen
PIXELS_DECODER = "none (pixels)"  # the decoder of a model that samples pixels (embedded scale)


def sampler_of(objective: str, sampling: Dict[str, Any]) -> Tuple[str, int]:
    """The sampler a run's samples are drawn with, and its steps: DiT's ``ddpm``, SiT's ``flow-sde`` or ``flow-ode``."""
    if objective == "ddpm":
        return "ddpm", sampling["ddpm_steps"]
    if sampling["flow_sampler"] not in FLOW_SAMPLERS:
        raise BadInput(
            f"sampling.flow_sampler={sampling['flow_sampler']!r} is unknown; use "
            f"{' or '.join(map(repr, FLOW_SAMPLERS))}."
        )
    return f"flow-{sampling['flow_sampler']}", sampling["flow_steps"]


def sampling_protocol(
    objective: str, sampling: Dict[str, Any], *, decoder: str, train_precision: str
) -> Dict[str, Any]:
    """How a run's samples are made: the fields a FID is comparable by (strings and numbers)."""
    sampler, steps = sampler_of(objective, sampling)
    return {
        "sampler": sampler,
        "sampler_steps": steps,
        "cfg_scale": sampling["cfg_scale"],
        "labels": sampling["labels"],
        "decoder": decoder,
        "train_precision": train_precision,
    }


def read_protocol(samples_dir: str | Path, stage: str) -> Dict[str, Any]:
    """The protocol the samples in ``samples_dir`` followed, as ``stage`` (sample_gen@RUN) recorded it."""
    path = Path(samples_dir) / PROTOCOL_FILE
    if not path.is_file():
        raise MissingInput(
            f"{path} is missing: these samples predate the protocol record; "
            f"rebuild them with `dvc repro -f -s {stage}`."
        )
    return json.loads(path.read_text())


def measured_protocol(sampled: Dict[str, Any], reference_meta: Dict[str, Any]) -> Dict[str, Any]:
    """The protocol a FID followed: the samples' (``protocol.json``) and the reference statistics'
    (``adm`` or ``own``, from data/fid_reference/meta.json)."""
    return {**sampled, "reference": reference_meta.get("reference", "own")}


def paper_protocol(fid_protocol: Dict[str, Any], objective: Optional[str]) -> Dict[str, Any]:
    """The paper's protocol (data/paper_reference.yaml ``fid_protocol``) for a run of ``objective``."""
    expected = dict(fid_protocol)
    expected["sampler"], expected["sampler_steps"] = expected.pop("samplers").get(objective, (None, None))
    return expected


# How a FID's protocol differs from the paper's, in words ({got}: the run's, {want}: the paper's).
DEVIATIONS = {
    "reference": "{got} reference statistics (the paper's: ADM's reference batch)",
    "labels": "{got} labels (the paper's: {want})",
    "decoder": "decoder {got} (the paper's: {want})",
    "train_precision": "trained in {got} (the paper's: {want})",
    "cfg_scale": "cfg {got} (the paper's: {want})",
    "num_samples": "{got} samples (the paper's: {want})",
    "fid_feature_dims": "FID over {got} feature coordinates (the paper's: all {want})",
    "sampler": "sampler {got} (the paper's: {want})",
    "sampler_steps": "{got} sampler steps (the paper's: {want})",
}


def deviations(metrics: Dict[str, Any], fid_protocol: Dict[str, Any], objective: Optional[str]) -> List[str]:
    """How a run's FID (its metrics.json) was measured differently from the paper's protocol, in words."""
    out = []
    for key, want in paper_protocol(fid_protocol, objective).items():
        got = metrics.get(key)
        if got is not None and got != want:
            out.append(DEVIATIONS.get(key, "{key} {got}").format(key=key, got=got, want=want))
    return out


def describe(protocol: Dict[str, Any]) -> str:
    """A protocol in words: a run's (its metrics.json) or the paper's, whose ``samplers`` name one per objective."""
    samplers = protocol.get("samplers") or {None: (protocol["sampler"], protocol["sampler_steps"])}
    sampled = " or ".join(
        f"{name} {steps} steps" + (f" ({objective} models)" if objective else "")
        for objective, (name, steps) in samplers.items()
    )
    return (
        f"{sampled}, cfg {protocol['cfg_scale']}, {protocol['labels']} labels, {protocol.get('num_samples')} "
        f"samples, decoder {protocol['decoder']}, {protocol['reference']} reference, "
        f"trained {protocol['train_precision']}"
    )
