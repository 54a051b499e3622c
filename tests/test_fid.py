"""FID/KID through torch-fidelity, offline: the digit feature net, its extractor, the metric's behaviour, the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch_fidelity
import torch_fidelity.feature_extractor_inceptionv3
from scipy import linalg
from sklearn.datasets import load_digits
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from vcarepro.metrics import digit_features
from vcarepro.metrics.digit_features import (
    DIGITS_EXTRACTOR,
    INCEPTION_EXTRACTOR,
    DigitFeatureNet,
    FeatureExtractorDigits,
    UInt8ImageDataset,
    compute_generation_metrics,
    evaluate_accuracy,
    load_feature_net,
    read_feature_net_config,
    register_digit_feature_extractor,
    save_feature_net,
    train_feature_net,
)

SIDE = 16  # the embedded pipeline upsamples the 8x8 digits to 16 or 32
# The shared net works at 16 px so that training it stays around a second on 2 cores;
# the default 32 px configuration is trained in the slow test below.
FAST_NET = dict(input_size=16, epochs=6, seed=0)


def digits_uint8(side: int = SIDE):
    digits = load_digits()
    images = torch.from_numpy(digits.images).float()[:, None] / 16.0
    images = F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False)
    return (images * 255).round().clamp(0, 255).to(torch.uint8), torch.from_numpy(digits.target)


@pytest.fixture(scope="module")
def digits():
    """Two disjoint random halves of load_digits: ``a`` plays the real set, ``b`` the samples."""
    images, labels = digits_uint8()
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    a, b = order[: len(order) // 2], order[len(order) // 2 :]
    return dict(a=images[a], a_labels=labels[a], b=images[b], b_labels=labels[b])


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    net, train_accuracy = train_feature_net(digits["a"], digits["a_labels"], **FAST_NET)
    path = tmp_path_factory.mktemp("featnet") / "digits.safetensors"
    save_feature_net(net, path)
    return dict(net=net, train_accuracy=train_accuracy, path=path)


@pytest.fixture(scope="module")
def split_metrics(digits, trained):
    return compute_generation_metrics(digits["a"], digits["b"], weights_path=trained["path"])


def metrics(real, fake, trained, **kwargs):
    return compute_generation_metrics(real, fake, weights_path=trained["path"], **kwargs)


def noise_like(images, seed=0):
    return torch.randint(0, 256, images.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- the feature net


def test_feature_net_learns_the_digits_and_generalises(digits, trained):
    assert trained["train_accuracy"] >= 0.97
    assert evaluate_accuracy(trained["net"], digits["b"], digits["b_labels"]) >= 0.93


@pytest.mark.slow
def test_default_feature_net_at_32_px_learns_the_digits():
    images, labels = digits_uint8(32)
    net, train_accuracy = train_feature_net(images[:1200], labels[:1200], seed=0)
    assert net.input_size == 32 and net.feature_dim == 64
    assert train_accuracy >= 0.97
    assert evaluate_accuracy(net, images[1200:], labels[1200:]) >= 0.9


def test_training_is_deterministic_given_the_seed(digits):
    subset = dict(images_uint8=digits["a"][:256], labels=digits["a_labels"][:256], epochs=1, input_size=8)
    rng_before = torch.get_rng_state()
    first, _ = train_feature_net(**subset, seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before), "training must not consume the caller's global RNG"
    second, _ = train_feature_net(**subset, seed=3)
    other, _ = train_feature_net(**subset, seed=4)
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name
    assert not torch.equal(first.head.weight, other.head.weight)


def test_features_are_the_same_for_grayscale_and_its_rgb_repeat(trained, digits):
    gray = digits["b"][:32].float() / 255
    with torch.no_grad():
        # equal up to float rounding: the net averages the three identical channels
        torch.testing.assert_close(
            trained["net"].features(gray.repeat(1, 3, 1, 1)), trained["net"].features(gray), rtol=1e-5, atol=1e-6
        )
        assert trained["net"].features(gray).shape == (32, trained["net"].feature_dim)


def test_features_of_any_resolution_land_in_one_space(trained, digits):
    # 8x8 originals and their 16x16 upsampling must be recognised alike: the net resizes internally
    small = F.interpolate(digits["b"].float() / 255, size=(8, 8), mode="area")
    assert evaluate_accuracy(trained["net"], (small * 255).round().to(torch.uint8), digits["b_labels"]) >= 0.85


def test_saved_net_reloads_with_its_config_and_gives_identical_features(trained, digits, tmp_path):
    path = tmp_path / "net.safetensors"
    save_feature_net(trained["net"], path)
    assert read_feature_net_config(path) == trained["net"].config
    reloaded = load_feature_net(path)
    x = digits["b"][:16].float() / 255
    with torch.no_grad():
        assert torch.equal(reloaded.features(x), trained["net"].features(x))
    assert [p.name for p in tmp_path.iterdir()] == ["net.safetensors"], "the atomic save leaves no temp file"


def test_feature_net_shapes_are_validated():
    with pytest.raises(ValueError, match="width divisible by 8"):
        DigitFeatureNet(width=12)
    with pytest.raises(ValueError, match=r"expects \(B, 1 or 3, H, W\)"):
        DigitFeatureNet(input_size=8).features(torch.zeros(2, 8, 8))


# --------------------------------------------------------------------------- torch-fidelity wiring


def test_extractor_is_registered_and_registration_is_idempotent():
    register_digit_feature_extractor()
    register_digit_feature_extractor()
    assert FEATURE_EXTRACTORS_REGISTRY[DIGITS_EXTRACTOR] is FeatureExtractorDigits
    assert issubclass(FeatureExtractorDigits, FeatureExtractorBase)


def test_registering_over_a_different_extractor_is_refused():
    with pytest.raises(ValueError, match="already has a different feature extractor"):
        register_digit_feature_extractor(INCEPTION_EXTRACTOR)


def test_extractor_follows_torch_fidelitys_contract(trained, digits):
    extractor = FeatureExtractorDigits(
        DIGITS_EXTRACTOR, ["logits", "features"], feature_extractor_weights_path=str(trained["path"]), verbose=False
    )
    batch = torch.stack([UInt8ImageDataset(digits["b"])[i] for i in range(8)])
    assert batch.dtype == torch.uint8 and batch.shape == (8, 3, SIDE, SIDE)
    logits, features = extractor(batch)  # in the order requested, not the order provided
    assert logits.shape == (8, 10) and features.shape == (8, trained["net"].feature_dim)
    assert features.dtype == torch.float32
    assert FeatureExtractorDigits.get_default_feature_layer_for_metric("fid") == "features"
    with pytest.raises(ValueError, match="uint8 Bx3xHxW"):
        extractor(batch.float())


def test_fid_of_a_set_against_itself_is_zero(digits, trained):
    result = metrics(digits["a"], digits["a"], trained)
    assert result["fid"] == pytest.approx(0.0, abs=1e-6)
    assert result["kid_mean"] < 1e-3


def test_fid_equals_the_frechet_distance_of_our_penultimate_features(digits, trained, split_metrics):
    with torch.no_grad():
        real = trained["net"].features(digits["a"].float() / 255).double().numpy()
        fake = trained["net"].features(digits["b"].float() / 255).double().numpy()
    mu_r, mu_f = real.mean(0), fake.mean(0)
    cov_r, cov_f = np.cov(real, rowvar=False), np.cov(fake, rowvar=False)
    covmean = linalg.sqrtm(cov_r @ cov_f).real
    expected = ((mu_r - mu_f) ** 2).sum() + np.trace(cov_r) + np.trace(cov_f) - 2 * np.trace(covmean)
    assert split_metrics["fid"] == pytest.approx(expected, rel=1e-3, abs=1e-6)


def test_result_reports_counts_extractor_and_kid(digits, split_metrics):
    assert split_metrics["num_real"] == len(digits["a"]) and split_metrics["num_fake"] == len(digits["b"])
    assert split_metrics["extractor"] == DIGITS_EXTRACTOR
    assert np.isfinite(split_metrics["kid_mean"]) and split_metrics["kid_std"] >= 0


def test_noise_is_much_farther_from_the_digits_than_a_held_out_split(digits, trained, split_metrics):
    noise = metrics(digits["a"], noise_like(digits["b"]), trained)
    assert noise["fid"] > 20 * split_metrics["fid"]
    assert noise["kid_mean"] > split_metrics["kid_mean"] + 0.01


def test_samples_of_one_class_are_farther_than_a_random_split_of_the_same_size(digits, trained):
    ones = digits["b"][digits["b_labels"] == 1]
    assert len(ones) >= 80  # above the 65-image minimum of a 64-dim feature space
    same_size_split = digits["b"][: len(ones)]  # FID's bias depends on sample size: compare like with like
    mode_collapsed = metrics(digits["a"], ones, trained)
    healthy = metrics(digits["a"], same_size_split, trained)
    assert mode_collapsed["fid"] > 5 * healthy["fid"]
    assert mode_collapsed["kid_mean"] > healthy["kid_mean"]


def test_nothing_is_cached_or_written_to_torch_home(digits, trained, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    first = metrics(digits["a"][:200], digits["b"][:200], trained)
    # same shapes, different pixels: a cache keyed by name would return the first answer
    second = metrics(digits["a"][:200], noise_like(digits["b"][:200]), trained)
    assert second["fid"] > 10 * first["fid"]
    assert list(tmp_path.iterdir()) == []


def test_kid_subset_size_defaults_to_what_the_smaller_set_allows(digits, trained):
    result = metrics(digits["a"][:300], digits["b"][:70], trained)  # torch-fidelity's default 1000 would fail here
    assert result["num_fake"] == 70 and np.isfinite(result["kid_mean"])
    seeded = [metrics(digits["a"][:300], digits["b"][:70], trained, kid_subset_size=50, seed=s) for s in (0, 0, 1)]
    assert seeded[0]["kid_mean"] == seeded[1]["kid_mean"] != seeded[2]["kid_mean"]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x: x.float() / 255, "must be uint8"),
        (lambda x: x[:, 0], r"must have shape \(N, C, H, W\)"),
        (lambda x: x.repeat(1, 2, 1, 1), r"C in \(1, 3\)"),
        (lambda x: x.numpy().astype(np.int64), "must be uint8"),
        (lambda x: x.tolist(), "numpy array or torch tensor"),
    ],
)
def test_malformed_images_are_rejected(digits, trained, bad, match):
    with pytest.raises(ValueError, match=match):
        metrics(bad(digits["a"]), digits["b"], trained)


def test_numpy_images_are_accepted(digits, trained, split_metrics):
    result = metrics(digits["a"].numpy(), digits["b"].numpy(), trained)
    assert result["fid"] == pytest.approx(split_metrics["fid"], rel=1e-6)


def test_too_few_samples_for_the_feature_dimension_are_rejected(digits, trained):
    with pytest.raises(ValueError, match="at least 65 images per set"):
        metrics(digits["a"], digits["b"][:64], trained)


def test_sets_of_different_resolutions_are_rejected(digits, trained):
    with pytest.raises(ValueError, match="differ in size"):
        metrics(digits["a"], F.interpolate(digits["b"], size=(8, 8)), trained)


def test_kid_subset_size_larger_than_a_set_is_rejected(digits, trained):
    with pytest.raises(ValueError, match="kid_subset_size=500"):
        metrics(digits["a"], digits["b"][:100], trained, kid_subset_size=500)


def test_digits_extractor_without_weights_is_rejected(digits, tmp_path):
    with pytest.raises(ValueError, match="needs weights_path"):
        compute_generation_metrics(digits["a"], digits["b"])
    with pytest.raises(ValueError, match="weights not found at .*absent.safetensors"):
        compute_generation_metrics(digits["a"], digits["b"], weights_path=tmp_path / "absent.safetensors")


def test_a_weights_file_not_written_by_save_feature_net_is_rejected(digits, tmp_path):
    foreign = tmp_path / "foreign.pth"
    torch.save({"w": torch.zeros(1)}, foreign)
    with pytest.raises(ValueError, match="not a safetensors file"):
        compute_generation_metrics(digits["a"], digits["b"], weights_path=foreign)


def test_unknown_extractor_is_rejected(digits, trained):
    with pytest.raises(ValueError, match="Unknown extractor 'clip'"):
        metrics(digits["a"], digits["b"], trained, extractor="clip")


def test_inception_with_a_missing_weights_file_fails_clearly_without_downloading(digits, tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("must not download")

    # torch-fidelity bound the downloader at import time, so patch it where it is used
    monkeypatch.setattr(torch_fidelity.feature_extractor_inceptionv3, "load_state_dict_from_url", no_network)
    missing = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    with pytest.raises(ValueError, match=r"Inception weights not found at .*pass its path as weights_path"):
        compute_generation_metrics(digits["a"], digits["b"], extractor=INCEPTION_EXTRACTOR, weights_path=missing)
    # without a path it looks where torch-fidelity's downloader would have cached the file, and says so
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with pytest.raises(ValueError, match=r"torch_home/hub/checkpoints/weights-inception-2015-12-05-6726825d.pth"):
        compute_generation_metrics(digits["a"], digits["b"], extractor=INCEPTION_EXTRACTOR)


def test_cuda_without_a_device_is_rejected(digits, trained):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="no CUDA device"):
        metrics(digits["a"], digits["b"], trained, cuda=True)


@pytest.mark.slow
def test_inception_path_runs_end_to_end_from_a_local_weights_file(digits, tmp_path, monkeypatch):
    # Random Inception weights stand in for the real file (not downloadable here): this checks the
    # wiring, that weights_path reaches torch-fidelity and nothing is fetched, not the numbers.
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with monkeypatch.context() as build:
        build.setattr(torch_fidelity.feature_extractor_inceptionv3, "load_state_dict_from_url", lambda *a, **k: {})
        build.setattr(FeatureExtractorInceptionV3, "load_state_dict", lambda self, state, *a, **k: None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            random_inception = FeatureExtractorInceptionV3(INCEPTION_EXTRACTOR, ["2048"])
    weights = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    torch.save(random_inception.state_dict(), weights)

    def no_network(*args, **kwargs):
        raise AssertionError("must not download")

    monkeypatch.setattr(torch_fidelity.feature_extractor_inceptionv3, "load_state_dict_from_url", no_network)
    # 2049 images per set through Inception is minutes on 2 CPU cores; lower the floor for this wiring check only
    monkeypatch.setattr(digit_features, "INCEPTION_FEATURE_DIM", 7)
    result = compute_generation_metrics(
        digits["a"][:8], digits["b"][:8], extractor=INCEPTION_EXTRACTOR, weights_path=weights
    )
    assert result["extractor"] == INCEPTION_EXTRACTOR and result["num_real"] == 8
    assert np.isfinite(result["fid"]) and result["fid"] > 0 and np.isfinite(result["kid_mean"])


def test_the_pipelines_streamed_evaluation_agrees_with_torch_fidelity(digits, trained, tmp_path):
    """eval_gen's path (reference statistics, kept features, samples .npz) gives torch-fidelity's FID."""
    from vcarepro.metrics.evaluator import evaluate_samples
    from vcarepro.metrics.extractors import DigitFeatures
    from vcarepro.metrics.fid_reference import reference_from_images

    extractor = DigitFeatures(trained["path"], torch.device("cpu"))
    real, fake = digits["a"][:400], digits["b"][:300]
    stats, kept = reference_from_images(
        (real[i : i + 64] for i in range(0, 400, 64)), extractor, keep_features=10_000, seed=0
    )
    np.savez(tmp_path / "samples.npz", fake.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).numpy())
    ours = evaluate_samples(tmp_path / "samples.npz", stats, extractor, reference_features=kept, min_samples=65)
    theirs = metrics(real, fake, trained)
    assert stats.num == 400 and len(kept) == 400
    assert ours["fid"] == pytest.approx(theirs["fid"], rel=1e-5)
    assert 0 <= ours["precision"] <= 1 and 0 <= ours["recall"] <= 1


# -- the same weights are the same bytes (issue 25: data/gen's extractor hashed differently in half the runs) -------


def _reordered_metadata(data: bytes) -> bytes:
    """``data`` with its ``__metadata__`` keys in reverse order: what the library writes in another process, whose
    Rust HashMap iterates differently."""
    import json as _json

    size = int.from_bytes(data[:8], "little")
    header = _json.loads(data[8 : 8 + size])
    header["__metadata__"] = dict(reversed(list(header["__metadata__"].items())))
    text = _json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size :]


def test_canonical_safetensors_orders_the_header_and_keeps_every_value():
    from safetensors.torch import load, save

    from vcarepro.core.io import canonical_safetensors, safetensors_bytes

    tensors = {
        "b": torch.arange(3.0),
        "a": torch.ones(2, 2, dtype=torch.float64),
        "c": torch.zeros(5, dtype=torch.int8),
    }
    plain = save(tensors)
    assert canonical_safetensors(plain) == plain  # without metadata the library's bytes are already canonical
    metadata = {"format": "x", "config": '{"width": 32}', "note": "ü"}
    written = safetensors_bytes(tensors, metadata)
    assert canonical_safetensors(_reordered_metadata(save(tensors, metadata=metadata))) == written
    assert canonical_safetensors(_reordered_metadata(written)) == written
    assert written.index(b'"config"') < written.index(b'"format"') < written.index(b'"note"')
    back = load(written)
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)
    size = int.from_bytes(written[:8], "little")
    assert size % 8 == 0 and written[8 + size :] == plain[8 + int.from_bytes(plain[:8], "little") :]  # data untouched


@pytest.mark.slow
def test_the_saved_extractor_is_the_same_bytes_in_every_process(tmp_path):
    """Five fresh interpreters save the same net: one file content (the library alone gave two, at random)."""
    import subprocess
    import sys

    code = (
        "import sys, torch; from vcarepro.metrics.digit_features import DigitFeatureNet, save_feature_net; "
        "torch.manual_seed(0); save_feature_net(DigitFeatureNet(width=8, feature_dim=16), sys.argv[1])"
    )
    contents = set()
    for i in range(5):
        out = tmp_path / f"net{i}.safetensors"
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=300)
        contents.add(out.read_bytes())
    assert len(contents) == 1
