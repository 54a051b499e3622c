"""Paper-scale generation data: ADM cropping, an offline VAE, posterior-moment shards, decoding."""

from __future__ import annotations

import json
import re
import shutil

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL
from PIL import Image

from vcarepro.data.folders import read_manifest, whole_files, write_manifest
from vcarepro.data.latents import (
    LatentShards,
    adm_center_crop,
    decode_to_uint8,
    encode_to_shards,
    load_vae,
    to_uint8_pixels,
)
from vcarepro.tools.standins import write_random_vae

CPU = torch.device("cpu")
IMAGE_SIZE = 16  # the tiny VAE downsamples by 2: 8x8 latents
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIZES = [(40, 30), (30, 50), (16, 16), (64, 20), (25, 25), (33, 47), (20, 70), (50, 50), (18, 31), (90, 40)]


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    # the stand-in VAE with two blocks instead of SD's four: 2x downsampling
    return write_random_vae(
        tmp_path_factory.mktemp("weights") / "vae", seed=0, block_out_channels=(8, 16), sample_size=32
    )


@pytest.fixture
def vae(vae_dir, one_torch_thread):
    return load_vae(str(vae_dir), CPU)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """Ten real JPEGs of mixed sizes (one grayscale) with labels 9, 8, ..., 0, and a file that is no image, as a
    prepared layout lists them: (image, label) pairs, the last one the broken file."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    items = []
    for i, (w, h) in enumerate(SIZES):
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).convert("L") if i == 3 else Image.fromarray(pixels)
        image.save(root / f"img{i}.jpg", quality=95)
        items.append(("train", f"img{i}.jpg", 9 - i))
    (root / "broken.jpg").write_bytes(b"not a jpeg at all")
    write_manifest(root, whole_files(root, items + [("train", "broken.jpg", 0)]))
    return read_manifest(root, "train")


@pytest.fixture
def prepared(tmp_path, jpegs, vae, one_torch_thread):
    out = tmp_path / "latents"
    calls = []
    index = encode_to_shards(
        jpegs[:-1],
        out,
        vae,
        image_size=IMAGE_SIZE,
        batch_size=3,
        shard_size=4,
        progress=lambda done, total: calls.append((done, total)),
    )
    return out, index, calls


def encoder_moments(vae, image: Image.Image):
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1).float()[None] / 127.5 - 1
    with torch.no_grad():
        posterior = vae.encode(x).latent_dist
    return posterior.mean[0].numpy(), posterior.std[0].numpy()


# ---------------------------------------------------------------- adm_center_crop


@pytest.mark.parametrize("size", [(300, 200), (200, 300), (256, 256), (50, 40), (1100, 700)])
def test_crop_is_a_square_of_the_requested_size(size):
    assert adm_center_crop(Image.new("RGB", size), 64).size == (64, 64)


@pytest.mark.parametrize(
    "size, boxes, bicubic",
    [
        ((1100, 700), [(550, 350)], (402, 256)),  # 256 * 550 / 350 = 402.3
        ((2048, 1100), [(1024, 550), (512, 275)], (477, 256)),  # halves while the short side >= 512
        ((600, 512), [(300, 256)], (300, 256)),  # exactly 2 * 256 is halved too
        ((600, 511), [], (301, 256)),  # 511 < 512: no halving
    ],
)
def test_large_images_are_box_halved_then_bicubic_resized(monkeypatch, size, boxes, bicubic):
    calls = []
    resize = Image.Image.resize

    def spy(self, new_size, resample=None, *args, **kwargs):
        calls.append((tuple(new_size), resample))
        return resize(self, new_size, resample, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    adm_center_crop(Image.new("RGB", size), 256)
    assert calls == [(box, Image.BOX) for box in boxes] + [(bicubic, Image.BICUBIC)]


@pytest.mark.parametrize("wide", [True, False])
def test_crop_keeps_the_centre_of_an_asymmetric_image(wide):
    # 600x200 (or 200x600): blue | red square | green along the long side
    strips = [np.full((200, 200, 3), colour, np.uint8) for colour in ([0, 0, 255], [255, 0, 0], [0, 255, 0])]
    pixels = np.concatenate(strips, axis=1 if wide else 0)
    crop = np.asarray(adm_center_crop(Image.fromarray(pixels), 64)).astype(int)
    inner = crop[:, 2:-2] if wide else crop[2:-2]  # bicubic blends only the pixels at the colour edges
    assert np.abs(inner - [255, 0, 0]).max() <= 2
    assert np.abs(crop.mean(axis=(0, 1)) - [255, 0, 0]).max() < 15


def test_odd_margin_drops_one_more_pixel_on_the_right():
    # 67x64 needs no resizing; (67 - 64) // 2 = 1 column is cut on the left, 2 on the right
    columns = np.broadcast_to(np.arange(67, dtype=np.uint8)[None, :, None], (64, 67, 3)).copy()
    crop = np.asarray(adm_center_crop(Image.fromarray(columns), 64))
    assert crop[0, :, 0].tolist() == list(range(1, 65))


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_any_mode_becomes_rgb(mode):
    crop = adm_center_crop(Image.new(mode, (80, 50)), 32)
    assert crop.mode == "RGB" and crop.size == (32, 32)


def test_grayscale_becomes_equal_rgb_channels():
    gray = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40), dtype=np.uint8), mode="L")
    crop = np.asarray(adm_center_crop(gray, 40))
    assert (crop[..., 0] == crop[..., 1]).all() and (crop[..., 1] == crop[..., 2]).all()
    assert (crop[..., 0] == np.asarray(gray)).all()


# ---------------------------------------------------------------- load_vae


def test_vae_loads_from_a_local_directory_in_eval_float32(vae_dir, network_attempts):
    vae = load_vae(str(vae_dir), CPU)
    assert isinstance(vae, AutoencoderKL) and not vae.training
    assert all(p.dtype == torch.float32 and p.device == CPU for p in vae.parameters())
    assert vae.config.scaling_factor == pytest.approx(0.18215)
    saved = AutoencoderKL.from_pretrained(vae_dir)
    assert torch.equal(vae.state_dict()["encoder.conv_in.weight"], saved.state_dict()["encoder.conv_in.weight"])
    assert network_attempts == []


def test_vae_loads_from_the_hub_cache_by_repo_id(tmp_path, vae_dir, monkeypatch, network_attempts):
    # the Hugging Face cache layout: models--org--name/{refs/main, snapshots/<commit>/...}
    cache = tmp_path / "hub"
    repo = cache / "models--vcarepro-tests--tiny-vae"
    commit = "0" * 40
    shutil.copytree(vae_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    vae = load_vae("vcarepro-tests/tiny-vae", CPU)
    assert isinstance(vae, AutoencoderKL) and vae.config.latent_channels == 4
    assert network_attempts == []


@pytest.mark.parametrize(
    "name", ["/nonexistent/weights/sd-vae-ft-ema", "vcarepro-tests/no-such-vae-0000", "weights/sd-vae-ft-ema"]
)
def test_missing_vae_says_what_and_how_without_network(monkeypatch, network_attempts, name):
    local_flags = []
    original = AutoencoderKL.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        local_flags.append(kwargs.get("local_files_only"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(AutoencoderKL, "from_pretrained", classmethod(spy))
    with pytest.raises(FileNotFoundError) as raised:
        load_vae(name, CPU)
    message = str(raised.value)
    assert repr(name) in message and "huggingface-cli download" in message and "prepare_gen.vae" in message
    assert message.count(". ") == 0 and message.endswith(".")  # one sentence
    assert network_attempts == [] and all(local_flags)


# ---------------------------------------------------------------- encode_to_shards


def test_shards_index_and_labels(prepared, jpegs):
    out, index, calls = prepared
    assert index == json.loads((out / "index.json").read_text())
    assert index == {
        "num_images": 10,
        "shard_size": 4,
        "shards": [4, 4, 2],
        "latent_shape": [4, 8, 8],
        "scaling_factor": pytest.approx(0.18215),
        "image_size": IMAGE_SIZE,
        "flip_variants": True,
        "posterior": "moments",
    }
    for k, count in enumerate([4, 4, 2]):
        moments = np.load(out / f"moments_{k:05d}.npy", mmap_mode="r")
        labels = np.load(out / f"labels_{k:05d}.npy")
        assert moments.shape == (count, 2, 2, 4, 8, 8) and moments.dtype == np.float16
        assert labels.dtype == np.int64 and labels.tolist() == [label for _, label in jpegs[4 * k : 4 * k + count]]
        assert (moments[:, :, 1] > 0).all()  # std
    assert sorted(p.name for p in out.iterdir()) == ["index.json"] + [f"labels_{k:05d}.npy" for k in range(3)] + [
        f"moments_{k:05d}.npy" for k in range(3)
    ]
    assert calls[-1] == (10, 10) and [done for done, _ in calls] == sorted(done for done, _ in calls)


@pytest.mark.parametrize("i", [3, 5, 9])  # grayscale, a middle shard, the short last shard
def test_stored_moments_are_the_encoders_for_the_image_and_its_mirror(prepared, jpegs, vae, i):
    out, _, _ = prepared
    stored = np.load(out / f"moments_{i // 4:05d}.npy")[i % 4].astype(np.float32)
    with Image.open(jpegs[i][0].file) as image:
        crop = adm_center_crop(image, IMAGE_SIZE)
    for variant, picture in enumerate([crop, crop.transpose(Image.FLIP_LEFT_RIGHT)]):
        mean, std = encoder_moments(vae, picture)
        np.testing.assert_allclose(stored[variant, 0], mean, rtol=2e-3, atol=1e-3)
        np.testing.assert_allclose(stored[variant, 1], std, rtol=2e-3, atol=1e-3)
    assert np.abs(stored[0, 0] - stored[1, 0]).max() > 1e-2  # the mirror is really a different encoding


def test_failure_midway_leaves_no_index(tmp_path, jpegs, vae):
    broken = jpegs[-1][0].file
    out = tmp_path / "latents"
    out.mkdir()
    (out / "index.json").write_text("{}")  # left by an earlier run: must not survive a failed one
    items = jpegs[:6] + jpegs[-1:] + jpegs[6:-1]
    with pytest.raises(OSError, match=re.escape(str(broken))):
        encode_to_shards(items, out, vae, image_size=IMAGE_SIZE, batch_size=3, shard_size=4)
    assert not (out / "index.json").exists()
    with pytest.raises(FileNotFoundError, match="not a finished latent preparation.*dvc repro prepare_gen"):
        LatentShards(out)


# ---------------------------------------------------------------- LatentShards


def write_synthetic(root, means, stds, labels, shard_size):
    """The documented format by hand: moments (n, [orig, mirror], [mean, std], C, h, w)."""
    root.mkdir(parents=True, exist_ok=True)
    counts = []
    for k, start in enumerate(range(0, len(labels), shard_size)):
        stop = min(start + shard_size, len(labels))
        np.save(
            root / f"moments_{k:05d}.npy", np.stack([means[start:stop], stds[start:stop]], axis=2).astype(np.float16)
        )
        np.save(root / f"labels_{k:05d}.npy", np.asarray(labels[start:stop], dtype=np.int64))
        counts.append(stop - start)
    (root / "index.json").write_text(
        json.dumps(
            {
                "num_images": len(labels),
                "shard_size": shard_size,
                "shards": counts,
                "latent_shape": list(means.shape[2:]),
                "scaling_factor": 0.5,
                "image_size": 16,
                "flip_variants": True,
                "posterior": "moments",
            }
        )
    )
    return LatentShards(root)


@pytest.fixture
def constant_shards(tmp_path):
    """std 0 and mean = 10 * index + variant everywhere: a sample names its source exactly."""
    n = 7
    means = (10 * np.arange(n)[:, None] + np.arange(2)[None, :]).astype(np.float32)
    means = np.broadcast_to(means[:, :, None, None, None], (n, 2, 2, 3, 3)).copy()
    return write_synthetic(tmp_path / "constant", means, np.zeros_like(means), list(range(100, 100 + n)), 3)


def test_reader_attributes(constant_shards):
    assert len(constant_shards) == constant_shards.num_images == 7
    assert constant_shards.latent_shape == (2, 3, 3) and constant_shards.scaling_factor == 0.5
    assert constant_shards.labels.dtype == torch.int64 and constant_shards.labels.tolist() == list(range(100, 107))


def test_batch_keeps_the_order_of_unsorted_repeated_cross_shard_indices_and_flips(constant_shards):
    indices = torch.tensor([6, 0, 4, 4, 2, 5, 0, 3])
    flip = torch.tensor([True, False, False, True, True, False, True, False])
    batch = constant_shards.batch(indices, flip, torch.Generator().manual_seed(0))
    assert batch.shape == (8, 2, 3, 3) and batch.dtype == torch.float32
    expected = (10 * indices + flip.long()).float() * 0.5
    assert torch.equal(batch, expected[:, None, None, None].expand_as(batch))


def test_out_of_range_index_is_refused(constant_shards):
    with pytest.raises(IndexError):
        constant_shards.batch(torch.tensor([7]), torch.tensor([False]), torch.Generator().manual_seed(0))


def test_samples_are_reproducible_and_centred_on_the_scaled_mean(tmp_path):
    rng = np.random.default_rng(0)
    means = rng.normal(0, 5, (5, 2, 4, 2, 2)).astype(np.float32)
    stds = rng.uniform(0.5, 2, (5, 2, 4, 2, 2)).astype(np.float32)
    shards = write_synthetic(tmp_path / "random", means, stds, [0] * 5, 2)
    indices, flip = torch.tensor([4, 1]), torch.tensor([False, True])
    one = shards.batch(indices, flip, torch.Generator().manual_seed(3))
    two = shards.batch(indices, flip, torch.Generator().manual_seed(3))
    assert torch.equal(one, two)
    generator = torch.Generator().manual_seed(4)
    draws = torch.stack([shards.batch(indices, flip, generator) for _ in range(2000)])
    assert not torch.equal(draws[0], draws[1])  # a fresh posterior sample each call
    target_mean = torch.from_numpy(means[[4, 1], [0, 1]].astype(np.float16).astype(np.float32)) * 0.5
    target_std = torch.from_numpy(stds[[4, 1], [0, 1]].astype(np.float16).astype(np.float32)) * 0.5
    # 2000 draws: the standard error of the mean is std / 45, so 5 standard errors is std / 9
    assert ((draws.mean(0) - target_mean).abs() < target_std / 9).all()
    assert torch.allclose(draws.std(0), target_std, rtol=0.1)


def test_batch_of_a_real_preparation_is_the_scaled_posterior_sample(prepared):
    out, _, _ = prepared
    shards = LatentShards(out)
    indices, flip = torch.tensor([9, 2, 5]), torch.tensor([True, False, True])
    batch = shards.batch(indices, flip, torch.Generator().manual_seed(1))
    eps = torch.randn((3, 4, 8, 8), generator=torch.Generator().manual_seed(1))
    stored = [np.load(out / f"moments_{i // 4:05d}.npy")[i % 4, int(f)] for i, f in zip(indices.tolist(), flip)]
    mean, std = (torch.from_numpy(np.stack([s[m] for s in stored]).astype(np.float32)) for m in (0, 1))
    assert torch.allclose(batch, (mean + std * eps) * 0.18215, atol=1e-6)
    assert shards.labels.tolist() == list(range(9, -1, -1))


# ---------------------------------------------------------------- decoding


def test_dit_uint8_rule():
    x = torch.tensor([-2.0, -1.0, (10.99 - 128) / 127.5, 0.0, 0.999, 1.0, 3.0])
    assert to_uint8_pixels(x).tolist() == [0, 0, 10, 128, 255, 255, 255]
    assert to_uint8_pixels(x).dtype == torch.uint8


def test_decode_to_uint8_shape_and_scaling(vae, one_torch_thread):
    latents = torch.randn(5, 4, 8, 8)
    images = decode_to_uint8(vae, latents, batch_size=2)
    assert images.shape == (5, 3, 16, 16) and images.dtype == torch.uint8 and images.device == CPU
    with torch.no_grad():
        expected = to_uint8_pixels(vae.decode(latents / 0.18215).sample)
    assert (images.int() - expected.int()).abs().max() <= 1
