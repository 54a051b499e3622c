"""The smoke scale's generated stand-ins, each read by the project's real loading code.

A miniature ImageNet as the official archives (prepare_cls), a random SD-shaped VAE
(AutoencoderKL.from_pretrained, prepare_gen's encoder), random Inception weights in
torch-fidelity's file format (the FID extractor) and an ADM reference batch (fid_reference's
loader); the same seed writes the same bytes, another seed other bytes.
"""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torch_fidelity.feature_extractor_inceptionv3 as tf_inception
import yaml
from PIL import Image

from helpers import ROOT
from vcarepro.core.errors import BadInput
from vcarepro.data.folders import ManifestDataset, read_classes, read_manifest
from vcarepro.data.imagenet import prepare_imagenet
from vcarepro.metrics.extractors import make_extractor
from vcarepro.metrics.fid_reference import adm_reference_features, load_adm_reference, write_reference
from vcarepro.metrics.inception import InceptionFeatures
from vcarepro.metrics.npz_images import iter_npz_images
from vcarepro.params.config import compose
from vcarepro.tools.standins import (
    DEVKIT_TAR,
    TRAIN_TAR,
    VAL_TAR,
    MiniImageNet,
    main,
    synthetic_batch,
    write_adm_reference,
    write_mini_imagenet,
    write_random_inception,
    write_random_vae,
    write_standins,
)

CPU = torch.device("cpu")
SMALL = dict(classes=3, train_per_class=6, val_per_class=3)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def file_bytes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def load_stage(name):
    spec = importlib.util.spec_from_file_location(f"stage_{name}", ROOT / "stages" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_download(*args, **kwargs):
    raise AssertionError("must not download")


# ----------------------------------------------------------------------------- the miniature ImageNet


def test_mini_imagenet_is_the_official_archives_with_a_devkit_in_torchvisions_format(tmp_path):
    root = write_mini_imagenet(tmp_path / "imagenet", seed=0, **SMALL)
    assert sorted(p.name for p in root.iterdir()) == sorted([TRAIN_TAR, VAL_TAR, DEVKIT_TAR])
    with tarfile.open(root / TRAIN_TAR) as outer:
        inner_names = outer.getnames()
        first = tarfile.open(fileobj=io.BytesIO(outer.extractfile(inner_names[0]).read()))
        assert first.getnames() == [f"{inner_names[0][:-4]}_{i}.JPEG" for i in range(6)]
    assert len(inner_names) == 3 and all(n.startswith("n") and len(n) == len("n01440764.tar") for n in inner_names)
    with tarfile.open(root / VAL_TAR) as tar:
        assert tar.getnames() == [f"ILSVRC2012_val_{n:08d}.JPEG" for n in range(1, 10)]

    with tarfile.open(root / DEVKIT_TAR, "r:gz") as devkit:
        meta = devkit.extractfile("ILSVRC2012_devkit_t12/data/meta.mat").read()
        truth = devkit.extractfile("ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt").read()
    synsets = scipy.io.loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    leaves = synsets[synsets["num_children"] == 0]  # torchvision's reading: leaves are the classes
    assert len(synsets) == 5 and len(leaves) == 3
    ids_by_wnid = dict(zip(leaves["WNID"], leaves["ILSVRC2012_ID"]))
    assert sorted(ids_by_wnid) == [n[:-4] for n in inner_names]
    in_wnid_order = [int(ids_by_wnid[w]) for w in sorted(ids_by_wnid)]
    assert sorted(in_wnid_order) == [1, 2, 3] and in_wnid_order != [1, 2, 3]  # a label mix-up cannot pass
    assert len(truth.decode().split()) == 9 and set(truth.decode().split()) == {"1", "2", "3"}


def test_mini_imagenet_is_prepared_by_the_prepare_cls_stage_with_expect_full_false(tmp_path, monkeypatch):
    root = write_mini_imagenet(tmp_path / "imagenet", seed=0, **SMALL)
    params = compose(
        [
            "scale=paper",
            f"prepare_cls.imagenet_root={root}",
            "prepare_cls.expect_full=false",
            "prepare_cls.workers=1",
            "prepare_cls.other_copy='stand-ins'",
        ]
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    load_stage("prepare_cls").main()

    out = tmp_path / "data" / "cls"
    mini = MiniImageNet.synthetic(seed=0, **SMALL)
    classes = read_classes(out)
    assert [c.wnid for c in classes] == sorted(mini.classes)
    assert [c.name for c in classes] == [mini.classes[w][1] for w in sorted(mini.classes)]  # from meta.mat
    train, val = read_manifest(out, "train"), read_manifest(out, "val")
    assert (len(train), len(val)) == (18, 9)
    for image, label in train:
        assert image.name in mini.train[classes[label].wnid]
    for image, label in val:  # the ground truth's IDs, mapped through meta.mat, give each val image its class
        assert mini.val[image.name][0] == classes[label].wnid
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["bad"]["count"] == 0 and report["non_jpeg"]["count"] == 0
    sizes = set()
    for split in ("train", "val"):
        dataset = ManifestDataset(out, split)
        for i in range(len(dataset)):
            image, _ = dataset[i]
            sizes.add(image.size)
    assert all(40 <= side <= 90 for size in sizes for side in size)
    assert len(sizes) > 10 and any(w != h for w, h in sizes) and any(w == h for w, h in sizes)


def test_mini_imagenet_images_show_their_class(tmp_path):
    """A linear classifier on 16 px thumbnails learns the classes from the train images and labels val."""
    from sklearn.linear_model import LogisticRegression

    mini = MiniImageNet.synthetic(classes=4, train_per_class=16, val_per_class=8, seed=3)
    wnids = sorted(mini.classes)

    def thumbnail(data):
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            return np.asarray(image.resize((16, 16)), dtype=np.float64).ravel() / 255

    x = [thumbnail(d) for w in wnids for d in mini.train[w].values()]
    y = [wnids.index(w) for w in wnids for _ in mini.train[w]]
    val_x = [thumbnail(d) for _, d in mini.val.values()]
    val_y = [wnids.index(w) for w, _ in mini.val.values()]
    accuracy = LogisticRegression(max_iter=2000).fit(x, y).score(val_x, val_y)
    assert accuracy >= 0.9  # chance is 0.25


def test_mini_imagenet_bytes_follow_the_seed(tmp_path, monkeypatch):
    first = file_bytes(write_mini_imagenet(tmp_path / "a", seed=0, **SMALL))
    with monkeypatch.context() as later:  # another day: no tar, gzip or meta.mat header may carry the clock
        later.setattr(time, "time", lambda: 2_000_000_000.0)
        later.setattr(time, "asctime", lambda *args: "Wed May 18 03:33:20 2033")
        again = file_bytes(write_mini_imagenet(tmp_path / "b", seed=0, **SMALL))
    assert again == first
    other = file_bytes(write_mini_imagenet(tmp_path / "c", seed=1, **SMALL))
    assert other.keys() == first.keys() and all(other[name] != first[name] for name in first)


def test_mini_imagenet_refuses_an_empty_miniature(tmp_path):
    with pytest.raises(BadInput, match=r"at least 2 classes and 1 train and 1 val image per class, got classes=1"):
        write_mini_imagenet(tmp_path / "x", classes=1)
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- the VAE


def test_random_vae_has_the_sd_vae_interface_and_loads_offline(tmp_path, network_attempts):
    from diffusers import AutoencoderKL

    from vcarepro.data.latents import decode_to_uint8, load_vae

    path = write_random_vae(tmp_path / "vae", seed=0)
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "diffusion_pytorch_model.safetensors"]
    direct = AutoencoderKL.from_pretrained(path, local_files_only=True)
    config = direct.config
    assert (config.in_channels, config.out_channels, config.latent_channels) == (3, 3, 4)
    assert len(config.down_block_types) == len(config.up_block_types) == 4  # SD's four blocks: 8x downsampling
    assert config.scaling_factor == pytest.approx(0.18215) and config.sample_size == 256
    assert sum(p.numel() for p in direct.parameters()) < 200_000  # tiny widths

    vae = load_vae(str(path), CPU)  # prepare_gen's loader (prepare_gen.vae: <path>)
    images = torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.inference_mode():
        posterior = vae.encode(images).latent_dist
    assert posterior.mean.shape == posterior.std.shape == (2, 4, 32, 32)
    decoded = decode_to_uint8(vae, posterior.mean * config.scaling_factor)
    assert decoded.shape == (2, 3, 256, 256) and decoded.dtype == torch.uint8
    assert network_attempts == []


def test_random_vae_bytes_follow_the_seed(tmp_path):
    first = file_bytes(write_random_vae(tmp_path / "a", seed=0))
    assert file_bytes(write_random_vae(tmp_path / "b", seed=0)) == first
    other = file_bytes(write_random_vae(tmp_path / "c", seed=1))
    assert other["config.json"] == first["config.json"]
    assert other["diffusion_pytorch_model.safetensors"] != first["diffusion_pytorch_model.safetensors"]


@pytest.mark.slow
def test_mini_imagenet_through_the_random_vae_gives_4x32x32_latent_shards(tmp_path):
    """prepare_gen's road on the stand-ins: the prepared miniature, ADM-cropped to 256 px, through the VAE."""
    from vcarepro.data.latents import encode_to_shards, load_vae

    prepare_imagenet(
        write_mini_imagenet(tmp_path / "imagenet", seed=0, **SMALL),
        tmp_path / "cls",
        expect_full=False,
        workers=1,
        other_copy="stand-ins",
    )
    items = read_manifest(tmp_path / "cls", "train")
    vae = load_vae(str(write_random_vae(tmp_path / "vae", seed=0)), CPU)
    index = encode_to_shards(items, tmp_path / "latents", vae, image_size=256, batch_size=8, shard_size=100)
    assert index["latent_shape"] == [4, 32, 32] and index["num_images"] == 18
    moments = np.load(tmp_path / "latents" / "moments_00000.npy")
    assert moments.shape == (18, 2, 2, 4, 32, 32) and np.isfinite(moments).all()


# ----------------------------------------------------------------------------- Inception


@pytest.fixture(scope="module")
def inception(tmp_path_factory):
    return write_random_inception(tmp_path_factory.mktemp("inception") / "inception.pth", seed=0)


@pytest.mark.slow
def test_random_inception_is_torch_fidelitys_file_format(inception):
    state = torch.load(inception, weights_only=True)
    assert type(state) is dict  # torch-fidelity's converter saves a plain dict, not a module's state_dict()
    network = InceptionFeatures(inception, "cpu").network
    expected = {k: v for k, v in network.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert list(state) == list(expected) and len(state) == 472
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32 and tensor.shape == expected[name].shape and tensor.is_contiguous()
        torch.testing.assert_close(expected[name], tensor, rtol=0, atol=0)  # loaded as written
    assert not any(k.endswith("conv.bias") for k in state)  # the 2015 graph's convolutions have no bias


@pytest.mark.slow
def test_random_inception_loads_through_the_projects_extractor_with_features_of_a_usable_scale(inception, monkeypatch):
    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", no_download)
    extractor, name = make_extractor(
        {"fid_extractor": "inception"}, {"inception_weights": str(inception)}, CPU, batch_size=4
    )  # what fid_reference and eval_gen build from prepare_gen
    assert name == "inception-v3-compat" and isinstance(extractor, InceptionFeatures)
    images = torch.from_numpy(synthetic_batch(4, classes=4, seed=9, split="reference")).permute(0, 3, 1, 2)
    pool, logits, spatial = extractor.extract(images)
    assert pool.shape == (4, 2048) and logits.shape == (4, 1008) and spatial.shape == (4, 2023)
    assert np.isfinite(pool).all() and np.isfinite(logits).all() and np.isfinite(spatial).all()
    # calibrated batch norms: with unit running variances the pool features would be ~1e-8
    assert 0.01 < pool.std() < 100 and 0.01 < spatial.std() < 100
    distances = np.linalg.norm(pool[:, None] - pool[None], axis=-1)
    assert (distances[~np.eye(4, dtype=bool)] > 1e-3 * np.linalg.norm(pool, axis=1).mean()).all()


@pytest.mark.slow
def test_random_inception_bytes_follow_the_seed(inception, tmp_path):
    again = write_random_inception(tmp_path / "a" / "inception.pth", seed=0)
    assert again.read_bytes() == inception.read_bytes()
    assert write_random_inception(tmp_path / "b" / "inception.pth", seed=1).read_bytes() != inception.read_bytes()


# ----------------------------------------------------------------------------- the ADM reference batch


@pytest.mark.slow
def test_adm_reference_is_read_by_the_projects_loader_and_holds_its_images_statistics(inception, tmp_path):
    path = write_adm_reference(
        tmp_path / "VIRTUAL_smoke.npz", inception_weights=inception, num_images=6, classes=3, seed=0, batch_size=4
    )
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == ["arr_0", "mu", "mu_s", "sigma", "sigma_s"]
        images = data["arr_0"]
        assert all(data[k].dtype == np.float64 for k in ("mu", "sigma", "mu_s", "sigma_s"))
    assert images.dtype == np.uint8 and images.shape == (6, 256, 256, 3)
    np.testing.assert_array_equal(np.concatenate(list(iter_npz_images(path, 4))), images)  # eval_gen's streaming

    stats, spatial = load_adm_reference(path), load_adm_reference(path, spatial=True)
    assert (stats.dim, stats.num, spatial.dim) == (2048, 6, 2023)
    extractor = InceptionFeatures(inception, "cpu", batch_size=3)
    pool, _, spatial_features = extractor.extract(torch.from_numpy(images).permute(0, 3, 1, 2))
    np.testing.assert_allclose(stats.mu, pool.mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(stats.sigma, np.cov(pool, rowvar=False), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(spatial.mu, spatial_features.mean(0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(spatial.sigma, np.cov(spatial_features, rowvar=False), rtol=1e-5, atol=1e-9)
    assert np.trace(stats.sigma) > 0.01 and not np.array_equal(images[0], images[1])

    np.testing.assert_allclose(adm_reference_features(path, extractor), pool.astype(np.float32), rtol=1e-6)
    (tmp_path / "ref").mkdir()
    info = write_reference(tmp_path / "ref", extractor, adm_npz=path, own=None)  # the fid_reference stage's writer
    assert (info["reference"], info["num_images"], info["feature_dim"], info["sfid"]) == ("adm", 6, 2048, True)


@pytest.mark.slow
def test_adm_reference_bytes_follow_the_seed(inception, tmp_path):
    def write(name, seed):
        return write_adm_reference(
            tmp_path / name / "ref.npz", inception_weights=inception, num_images=3, classes=3, seed=seed
        ).read_bytes()

    first = write("a", 0)
    assert write("b", 0) == first  # the .npz members carry a fixed time
    assert write("c", 1) != first
    with pytest.raises(BadInput, match="at least 2 images"):
        write_adm_reference(tmp_path / "d.npz", inception_weights=inception, num_images=1)
    assert not (tmp_path / "d.npz").exists()


# ----------------------------------------------------------------------------- all four, from the command line


@pytest.mark.slow
def test_the_command_writes_all_four_atomically_with_one_line_each(tmp_path, capsys):
    out = tmp_path / "standins"
    main(["--out", str(out), "--seed", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["imagenet", "vae", "inception", "adm_reference"]
    assert all("written" in line for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["standins"]  # no temporary directory left beside it
    assert sorted(p.name for p in out.iterdir()) == [
        "VIRTUAL_imagenet256_smoke.npz",
        "imagenet",
        "inception.pth",
        "standins.json",
        "vae",
    ]
    manifest = json.loads((out / "standins.json").read_text())
    assert manifest["seed"] == 0 and manifest["files"]["inception.pth"] == (out / "inception.pth").stat().st_size
    assert load_adm_reference(out / "VIRTUAL_imagenet256_smoke.npz").num == 64
    assert (out / "inception.pth").stat().st_mode & 0o044  # readable beyond its owner, as a plain write makes it
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}

    main(["--out", str(out), "--seed", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all("already there" in line for line in lines)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


@pytest.mark.slow
def test_a_rerun_keeps_the_same_stand_ins_and_rebuilds_damaged_or_other_ones(tmp_path):
    small = dict(classes=2, train_per_class=2, val_per_class=1, reference_images=3)
    out = tmp_path / "standins"
    assert all(written for _, _, written in write_standins(out, seed=0, **small))
    first = file_bytes(out)
    assert not any(written for _, _, written in write_standins(out, seed=0, **small))

    (out / "inception.pth").write_bytes(b"truncated")  # a damaged directory is rebuilt, not trusted
    assert all(written for _, _, written in write_standins(out, seed=0, **small))
    assert file_bytes(out) == first

    write_standins(out, seed=1, **small)  # another seed replaces the directory
    assert json.loads((out / "standins.json").read_text())["seed"] == 1
    second = file_bytes(out)
    assert second.keys() == first.keys() and second["inception.pth"] != first["inception.pth"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["standins"]

    for mine in ("notes.txt", "imagenet/notes.txt"):  # a rebuild would remove it, at any depth: refused
        (out / mine).write_text("a user's file among the stand-ins")
        with pytest.raises(BadInput, match=f"holds '{mine}', which vcarepro.tools.standins did not write"):
            write_standins(out, seed=2, **small)
        assert file_bytes(out).keys() == {*second.keys(), mine}
        (out / mine).unlink()


@pytest.mark.slow
def test_the_command_refuses_a_directory_it_did_not_write_in_one_line(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    result = subprocess.run(
        [sys.executable, "-m", "vcarepro.tools.standins", "--out", str(foreign)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {foreign} exists and was not written by vcarepro.tools.standins (no standins.json); remove it or pass "
        f"another --out."
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"] and (foreign / "notes.txt").read_text() == "keep me"
