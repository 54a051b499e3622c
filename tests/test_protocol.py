"""The FID protocol in one place: sampling records what it followed, eval_gen copies it, one formatter words it."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import ROOT
from vcarepro.core.errors import MissingInput
from vcarepro.metrics.protocol import (
    PIXELS_DECODER,
    PROTOCOL_FILE,
    describe,
    deviations,
    measured_protocol,
    read_protocol,
    sampler_of,
    sampling_protocol,
)
from vcarepro.report.reference import load_reference

SAMPLING = {
    "num_samples": 6,
    "batch_size": 3,
    "labels": "balanced",
    "vae_decoder": "stabilityai/sd-vae-ft-ema",
    "ddpm_steps": 2,
    "flow_sampler": "sde",
    "flow_ode_method": "euler",
    "flow_steps": 4,
    "cfg_scale": 1.5,
}


@pytest.mark.parametrize(
    "objective, flow_sampler, sampler, steps",
    [("ddpm", "ode", "ddpm", 2), ("flow", "sde", "flow-sde", 4), ("flow", "ode", "flow-ode", 4)],
)
def test_sampling_records_the_protocol_it_followed(
    tmp_path, monkeypatch, one_torch_thread, objective, flow_sampler, sampler, steps
):
    """protocol.json beside the samples names the sampler, steps and guidance generate_batches called, and the labels
    the .npz holds."""
    from vcarepro.data.samples import read_samples
    from vcarepro.params.config import compose
    from vcarepro.train.diffusion import GaussianDiffusion
    from vcarepro.train.flow import FlowMatching
    from vcarepro.train.generation import GeneratorSpec
    from vcarepro.train.sampling import sample_space, write_protocol, write_seed_samples

    calls = []

    def recorder(name):
        def sample(self, model, noise, y, *, num_steps, cfg_scale, **kwargs):
            calls.append((name, num_steps, cfg_scale))
            return noise.clamp(-1, 1)

        return sample

    monkeypatch.setattr(GaussianDiffusion, "sample", recorder("ddpm"))
    monkeypatch.setattr(FlowMatching, "sample_sde", recorder("flow-sde"))
    monkeypatch.setattr(FlowMatching, "sample_ode", recorder("flow-ode"))

    sampling = dict(SAMPLING, flow_sampler=flow_sampler)
    meta = {"kind": "pixels", "channels": 1, "image_size": 8, "num_classes": 10}
    space = sample_space(meta, sampling["vae_decoder"], torch.device("cpu"))
    model = GeneratorSpec("dit_s2", "mhsa", {}, dict(compose([])["gen_shape"], depth=1, hidden_size=32)).create()
    written = write_protocol(tmp_path, objective, sampling, space, "fp32")
    write_seed_samples(
        model,
        objective,
        sampling,
        space,
        tmp_path,
        0,
        num_classes=10,
        device=torch.device("cpu"),
        flow_path="linear",
        work_dir=tmp_path / "work",
        key="k",
        log=lambda message: None,
    )

    protocol = json.loads((tmp_path / PROTOCOL_FILE).read_text())
    assert (
        protocol
        == written
        == {
            "sampler": sampler,
            "sampler_steps": steps,
            "cfg_scale": 1.5,
            "labels": "balanced",
            "decoder": PIXELS_DECODER,
            "train_precision": "fp32",
        }
    )
    assert calls == [(protocol["sampler"], protocol["sampler_steps"], protocol["cfg_scale"])] * 2  # two batches
    images, labels = read_samples(tmp_path / "seed_0.npz")
    assert images.shape == (6, 8, 8, 3) and labels.tolist() == list(range(6))  # balanced, as recorded
    assert (tmp_path / "grid_seed_0.png").is_file()


def test_an_unknown_flow_sampler_is_refused_before_any_sample():
    with pytest.raises(ValueError, match="sampling.flow_sampler='euler' is unknown; use 'sde' or 'ode'"):
        sampler_of("flow", dict(SAMPLING, flow_sampler="euler"))
    assert sampler_of("ddpm", dict(SAMPLING, flow_sampler="euler")) == ("ddpm", 2)  # a DDPM run ignores it


def test_eval_gen_copies_the_samples_protocol_and_adds_the_reference(tmp_path):
    sampled = sampling_protocol("flow", SAMPLING, decoder="stabilityai/sd-vae-ft-ema", train_precision="tf32")
    (tmp_path / PROTOCOL_FILE).write_text(json.dumps(sampled))
    assert measured_protocol(read_protocol(tmp_path, "sample_gen@x"), {"reference": "adm"}) == {
        **sampled,
        "reference": "adm",
    }
    assert measured_protocol(sampled, {})["reference"] == "own"  # statistics of our own images
    (tmp_path / PROTOCOL_FILE).unlink()
    with pytest.raises(MissingInput, match=r"rebuild them with `dvc repro -f -s sample_gen@x`"):
        read_protocol(tmp_path, "sample_gen@x")
    # the stage copies, it does not rebuild: no sampler choice is made in eval_gen
    stage = (ROOT / "stages" / "eval_gen.py").read_text()
    assert "read_protocol(" in stage and "flow_sampler" not in stage and "ddpm_steps" not in stage


def test_one_formatter_words_the_papers_protocol_and_ours():
    paper = load_reference(ROOT / "data" / "paper_reference.yaml")["fid_protocol"]
    assert describe(paper) == (
        "ddpm 250 steps (ddpm models) or flow-sde 250 steps (flow models), cfg 1.0, random "
        "labels, 50000 samples, decoder stabilityai/sd-vae-ft-ema, adm reference, trained tf32"
    )
    ours = {
        **sampling_protocol(
            "ddpm",
            dict(SAMPLING, ddpm_steps=3, labels="random", cfg_scale=1.0),
            decoder=PIXELS_DECODER,
            train_precision="fp32",
        ),
        "reference": "own",
        "num_samples": 70,
        "fid": 2.2,
    }
    assert describe(ours) == (
        "ddpm 3 steps, cfg 1.0, random labels, 70 samples, decoder none (pixels), own reference, trained fp32"
    )


def test_deviations_from_the_papers_protocol_are_worded_per_field():
    paper = load_reference(ROOT / "data" / "paper_reference.yaml")["fid_protocol"]
    followed = {
        **sampling_protocol(
            "flow",
            dict(SAMPLING, flow_steps=250, cfg_scale=1.0, labels="random"),
            decoder="stabilityai/sd-vae-ft-ema",
            train_precision="tf32",
        ),
        "reference": "adm",
        "num_samples": 50000,
        "fid_feature_dims": 2048,
    }
    assert deviations(followed, paper, "flow") == []
    assert deviations(followed, paper, "ddpm") == ["sampler flow-sde (the paper's: ddpm)"]
    assert deviations({**followed, "labels": "balanced", "reference": "own"}, paper, "flow") == [
        "own reference statistics (the paper's: ADM's reference batch)",
        "balanced labels (the paper's: random)",
    ]
