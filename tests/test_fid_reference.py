"""ADM-style FID-50K evaluation: statistics, reference files, FID/IS/precision-recall, sample streaming, Inception
wiring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch_fidelity.feature_extractor_inceptionv3 as tf_inception
from scipy import linalg
from scipy.spatial.distance import cdist
from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

from helpers import ROOT
from vcarepro.metrics.evaluator import evaluate_samples
from vcarepro.metrics.feature_stats import FeatureReservoir, FeatureStats, StatsAccumulator, frechet_distance
from vcarepro.metrics.fid_reference import (
    adm_reference_features,
    load_adm_reference,
    reference_from_images,
    write_reference,
)
from vcarepro.metrics.inception import SPATIAL_FEATURE_DIM, InceptionFeatures
from vcarepro.metrics.inception_score import inception_score
from vcarepro.metrics.kid import kernel_inception_distance
from vcarepro.metrics.precision_recall import precision_recall
from vcarepro.tools.standins import write_random_inception

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_stats(rng, dim, num=100):
    features = rng.normal(size=(num, dim)) @ rng.normal(size=(dim, dim))
    return FeatureStats(mu=features.mean(0), sigma=np.cov(features, rowvar=False), num=num)


# --------------------------------------------------------------------------- statistics


def test_accumulator_matches_numpy_mean_and_cov_over_uneven_batches():
    rng = np.random.default_rng(0)
    # a large offset against a small spread: naive E[xx^T] - mu mu^T would lose most digits here
    features = 1000.0 + rng.normal(size=(100, 5)) @ rng.normal(size=(5, 5))
    accumulator = StatsAccumulator(5)
    start = 0
    for size in (1, 7, 30, 0, 2, 60):
        batch = features[start : start + size]
        accumulator.update(torch.from_numpy(batch) if size == 30 else batch)  # tensors and arrays alike
        start += size
    stats = accumulator.result()
    assert stats.num == 100
    np.testing.assert_allclose(stats.mu, features.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.sigma, np.cov(features, rowvar=False), rtol=1e-9, atol=1e-9)
    assert stats.mu.dtype == stats.sigma.dtype == np.float64
    np.testing.assert_array_equal(stats.sigma, stats.sigma.T)


def test_accumulator_rejects_wrong_widths_and_too_few_vectors():
    accumulator = StatsAccumulator(3)
    with pytest.raises(ValueError, match=r"expects \(B, 3\) features"):
        accumulator.update(np.zeros((4, 2)))
    accumulator.update(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="at least 2 feature vectors"):
        accumulator.result()


def test_feature_stats_round_trip_to_exactly_the_given_path(tmp_path):
    stats = random_stats(np.random.default_rng(1), 4, num=37)
    path = tmp_path / "sub" / "reference.stats"  # no .npz suffix: numpy must not append one
    stats.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["reference.stats"]  # no temp file left behind
    loaded = FeatureStats.load(path)
    np.testing.assert_array_equal(loaded.mu, stats.mu)
    np.testing.assert_array_equal(loaded.sigma, stats.sigma)
    assert loaded.num == 37
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == ["mu", "num", "sigma"]
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        FeatureStats.load(tmp_path / "missing.npz")


def test_load_adm_reference_reads_mu_sigma_and_counts_the_images(tmp_path):
    rng = np.random.default_rng(2)
    pool, spatial = random_stats(rng, 4), random_stats(rng, 3)
    path = tmp_path / "VIRTUAL_test.npz"
    np.savez(
        path,
        arr_0=np.zeros((5, 8, 8, 3), np.uint8),
        mu=pool.mu,
        sigma=pool.sigma,
        mu_s=spatial.mu,
        sigma_s=spatial.sigma,
    )
    loaded = load_adm_reference(path)
    np.testing.assert_array_equal(loaded.mu, pool.mu)
    np.testing.assert_array_equal(loaded.sigma, pool.sigma)
    assert loaded.num == 5
    loaded_spatial = load_adm_reference(path, spatial=True)
    np.testing.assert_array_equal(loaded_spatial.sigma, spatial.sigma)


def test_load_adm_reference_errors_name_the_file_and_the_fix(tmp_path):
    missing = tmp_path / "VIRTUAL_imagenet256_labeled.npz"
    with pytest.raises(FileNotFoundError, match=r"VIRTUAL_imagenet256_labeled.npz; download .*put it there"):
        load_adm_reference(missing)
    wrong = tmp_path / "samples.npz"
    np.savez(wrong, arr_0=np.zeros((2, 4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match=r"samples.npz has no mu or sigma .*not an ADM reference batch"):
        load_adm_reference(wrong)


# --------------------------------------------------------------------------- FID and IS


def test_frechet_distance_matches_the_diagonal_closed_form():
    rng = np.random.default_rng(3)
    mu1, mu2 = rng.normal(size=6), rng.normal(size=6)
    s1, s2 = rng.uniform(0.1, 3.0, size=6), rng.uniform(0.1, 3.0, size=6)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum(s1 + s2 - 2 * np.sqrt(s1 * s2))
    fid = frechet_distance(FeatureStats(mu1, np.diag(s1), 10), FeatureStats(mu2, np.diag(s2), 10))
    assert fid == pytest.approx(expected, rel=1e-10)


def test_frechet_distance_agrees_with_adm_sqrtm_and_is_zero_for_identical_stats():
    rng = np.random.default_rng(4)
    a, b = random_stats(rng, 8), random_stats(rng, 8)
    covmean = linalg.sqrtm(a.sigma @ b.sigma).real  # ADM's formula
    adm = np.sum((a.mu - b.mu) ** 2) + np.trace(a.sigma) + np.trace(b.sigma) - 2 * np.trace(covmean)
    assert frechet_distance(a, b) == pytest.approx(adm, rel=1e-8)
    assert abs(frechet_distance(a, a)) < 1e-8
    with pytest.raises(ValueError, match="Cannot compare 8-d with 4-d"):
        frechet_distance(a, random_stats(rng, 4))


def test_inception_score_of_uniform_predictions_is_one():
    mean, std = inception_score(np.zeros((100, 10)), split_size=10)
    assert mean == pytest.approx(1.0, abs=1e-12) and std == pytest.approx(0.0, abs=1e-12)


def test_inception_score_of_confident_evenly_spread_predictions_is_the_class_count():
    classes = 5
    logits = 100.0 * np.eye(classes)[np.arange(100) % classes]  # every split of 10 holds each class twice
    mean, std = inception_score(logits, split_size=10)
    assert mean == pytest.approx(classes, rel=1e-9) and std == pytest.approx(0.0, abs=1e-9)


def test_inception_score_splits_the_samples_in_order_as_adm_does():
    # first half all class 0, second half all class 1: each in-order split is one class (IS 1),
    # the whole set is two classes (IS 2); shuffling before splitting would mix them
    logits = 100.0 * np.eye(2)[np.repeat([0, 1], 50)]
    assert inception_score(logits, split_size=50) == pytest.approx((1.0, 0.0), abs=1e-9)
    assert inception_score(logits, split_size=100)[0] == pytest.approx(2.0, rel=1e-9)
    # splits of a fixed size, the last one shorter, as ADM's range(0, N, split_size): rows 0-39 (class 0),
    # 40-79 (10 of class 0, 30 of class 1: IS = exp(entropy of 1/4, 3/4)), 80-99 (class 1)
    middle = np.exp(-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)))
    mean, std = inception_score(logits, split_size=40)
    assert mean == pytest.approx((1.0 + middle + 1.0) / 3, rel=1e-9)
    assert std == pytest.approx(np.std([1.0, middle, 1.0]), rel=1e-9)


# --------------------------------------------------------------------------- precision and recall


def brute_force_precision_recall(real, fake, k):
    def radii(points):
        return np.sort(cdist(points, points), axis=1)[:, k]  # column 0 is the point itself

    def fraction_inside(queries, manifold):
        return np.mean((cdist(queries, manifold) <= radii(manifold)[None, :]).any(axis=1))

    return fraction_inside(fake, real), fraction_inside(real, fake)


def test_precision_recall_of_identical_sets_is_one_and_of_distant_sets_zero():
    real = np.random.default_rng(5).normal(size=(200, 8))
    assert precision_recall(real, real.copy()) == (1.0, 1.0)
    assert precision_recall(real, real + 100.0) == (0.0, 0.0)


def test_precision_counts_the_fake_points_inside_the_real_manifold():
    rng = np.random.default_rng(6)
    real = rng.normal(size=(200, 8))
    fake = np.concatenate([real[:100] + 1e-3 * rng.normal(size=(100, 8)), rng.normal(size=(100, 8)) + 100.0])
    precision, recall = precision_recall(real, fake)
    assert precision == 0.5
    assert 0.5 <= recall < 1.0


def test_radius_is_the_kth_neighbour_excluding_self_and_any_ball_counts():
    # 1-D, k=1: radii of real points 0, 1, 3, 7 are 1, 1, 2, 4 (nearest other point)
    real = np.array([[0.0], [1.0], [3.0], [7.0]])
    # 11 lies on the ball of 7 (<=); 5 lies in the balls of 3 and 7; 11.5 and -1.5 lie in none.
    # Were the point itself counted as its nearest neighbour, every radius would be 0 and none would be inside.
    fake = np.array([[11.0], [5.0], [11.5], [-1.5]])
    precision, _ = precision_recall(real, fake, k=1)
    assert precision == 0.5


def test_precision_recall_matches_brute_force_whatever_the_block_size():
    rng = np.random.default_rng(7)
    real = rng.normal(size=(150, 6))
    fake = np.concatenate([real[:60] + 0.3 * rng.normal(size=(60, 6)), 1.5 * rng.normal(size=(70, 6)) + 1.0])
    expected = brute_force_precision_recall(real, fake, k=3)
    assert 0.0 < expected[0] < 1.0 and 0.0 < expected[1] < 1.0  # a case where the boundaries matter
    for batch_size in (7, 64, 10000):
        assert precision_recall(real, fake, batch_size=batch_size) == pytest.approx(expected, abs=1e-12)


def test_precision_recall_needs_more_points_than_k():
    with pytest.raises(ValueError, match="more than 3 points per set"):
        precision_recall(np.zeros((3, 2)), np.zeros((10, 2)))


# --------------------------------------------------------------------------- KID


def test_kid_is_torch_fidelitys_over_subsets_no_larger_than_the_smaller_set():
    rng = np.random.default_rng(8)
    real = rng.normal(size=(30, 5)).astype(np.float32)
    fake = (rng.normal(size=(20, 5)) + 0.5).astype(np.float32)
    mean, std = kernel_inception_distance(real, fake, subsets=7, subset_size=1000, seed=3)
    theirs = kid_features_to_metric(
        torch.from_numpy(real), torch.from_numpy(fake), kid_subsets=7, kid_subset_size=20, rng_seed=3, verbose=False
    )
    assert (mean, std) == (theirs[KEY_METRIC_KID_MEAN], theirs[KEY_METRIC_KID_STD])
    assert mean > 0 and std > 0
    with pytest.raises(ValueError, match="KID subset size 21"):  # what the clip to 20 spares a smoke evaluation
        kid_features_to_metric(
            torch.from_numpy(real), torch.from_numpy(fake), kid_subsets=7, kid_subset_size=21, verbose=False
        )
    assert kernel_inception_distance(real, fake, subsets=7, subset_size=10, seed=4) != kernel_inception_distance(
        real, fake, subsets=7, subset_size=10, seed=3
    )


# --------------------------------------------------------------------------- reservoir and reference statistics


def stream(rows, cuts):
    edges = [0, *cuts, len(rows)]
    return [rows[a:b] for a, b in zip(edges, edges[1:])]


def reservoir_of(rows, cuts, capacity, seed):
    reservoir = FeatureReservoir(capacity, rows.shape[1], seed=seed, dtype=np.float64)
    for batch in stream(rows, cuts):
        reservoir.update(batch)
    return reservoir.result()


def test_reservoir_is_deterministic_in_seed_and_independent_of_batching():
    rows = np.arange(300, dtype=np.float64).reshape(100, 3)
    kept = reservoir_of(rows, [10, 11, 50], capacity=20, seed=0)
    assert kept.shape == (20, 3)
    assert len({tuple(r) for r in kept}) == 20 and {tuple(r) for r in kept} <= {tuple(r) for r in rows}
    np.testing.assert_array_equal(kept, reservoir_of(rows, [10, 11, 50], capacity=20, seed=0))
    np.testing.assert_array_equal(kept, reservoir_of(rows, [3, 97], capacity=20, seed=0))
    assert not np.array_equal(kept, reservoir_of(rows, [10, 11, 50], capacity=20, seed=1))
    assert reservoir_of(rows[:7], [2], capacity=20, seed=0).shape == (7, 3)  # fewer rows than capacity: all of them


def test_reservoir_keeps_every_row_with_equal_probability():
    rows = np.arange(20, dtype=np.float64)[:, None]
    counts = np.zeros(20)
    for seed in range(400):
        counts[reservoir_of(rows, [4, 13], capacity=5, seed=seed)[:, 0].astype(int)] += 1
    # each row is kept with probability 5/20; the binomial std over 400 draws is about 0.022
    np.testing.assert_allclose(counts / 400, 0.25, atol=0.075)


class FakeExtractor:
    """Deterministic stand-in for InceptionFeatures: fixed random projections of the pixels."""

    def __init__(self, *, dim=4, classes=6, batch_size=7, side=8):
        generator = np.random.default_rng(123)
        self.pool_weights = generator.normal(size=(3 * side * side, dim)) / 255.0
        self.logit_weights = generator.normal(size=(3 * side * side, classes)) / 64.0
        self.spatial_weights = generator.normal(size=(3 * side * side, 3)) / 255.0
        self.batch_size = batch_size
        self.batch_sizes = []

    def extract(self, images):
        assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.shape[1] == 3
        self.batch_sizes.append(images.shape[0])
        pixels = images.reshape(images.shape[0], -1).double().numpy()
        return (
            pixels @ self.pool_weights,
            (pixels @ self.logit_weights).astype(np.float32),
            pixels @ self.spatial_weights,
        )

    def __call__(self, images):
        pool, logits, _ = self.extract(images)
        return torch.from_numpy(pool), torch.from_numpy(logits)  # tensors or arrays: both are accepted


def random_images(n, seed, side=8):
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)


def direct_features(images_nhwc, extractor):
    return FakeExtractor(batch_size=len(images_nhwc)).extract(torch.from_numpy(images_nhwc).permute(0, 3, 1, 2))


def test_reference_from_images_stats_cover_all_images_and_keep_a_subset():
    images = random_images(30, seed=8)
    batches = [torch.from_numpy(b).permute(0, 3, 1, 2) for b in np.array_split(images, [4, 5, 19])]
    stats, kept = reference_from_images(iter(batches), FakeExtractor(), keep_features=10, seed=3)
    pool = direct_features(images, None)[0]
    assert stats.num == 30
    np.testing.assert_allclose(stats.mu, pool.mean(0), rtol=1e-10)
    np.testing.assert_allclose(stats.sigma, np.cov(pool, rowvar=False), rtol=1e-8)
    assert kept.shape == (10, 4) and kept.dtype == np.float32
    assert all(np.abs(pool.astype(np.float32) - row).max(axis=1).min() == 0 for row in kept)
    # spatial=True adds the sFID statistics and changes nothing else
    stats_again, kept_again, spatial = reference_from_images(
        iter(batches), FakeExtractor(), keep_features=10, seed=3, spatial=True
    )
    np.testing.assert_array_equal(kept_again, kept)
    np.testing.assert_array_equal(stats_again.sigma, stats.sigma)
    spatial_features = direct_features(images, None)[2]
    np.testing.assert_allclose(spatial.sigma, np.cov(spatial_features, rowvar=False), rtol=1e-8)
    with pytest.raises(ValueError, match="got no images"):
        reference_from_images(iter([]), FakeExtractor())


def test_evaluate_samples_streams_the_file_and_computes_adm_metrics(tmp_path):
    samples, reference_images = random_images(40, seed=10), random_images(50, seed=11)
    path = tmp_path / "samples.npz"
    np.savez(path, samples)
    ref_pool, _, ref_spatial = direct_features(reference_images, None)
    reference = FeatureStats(ref_pool.mean(0), np.cov(ref_pool, rowvar=False), 50)
    pool, logits, spatial = direct_features(samples, None)

    extractor = FakeExtractor(batch_size=7)
    result = evaluate_samples(path, reference, extractor, min_samples=5, split_size=10)
    assert extractor.batch_sizes == [7, 7, 7, 7, 7, 5]  # streamed, never the whole file at once
    assert set(result) == {"fid", "inception_score", "inception_score_std", "num_samples", "fid_feature_dims"}
    assert result["num_samples"] == 40
    samples_stats = FeatureStats(pool.mean(0), np.cov(pool, rowvar=False), 40)
    assert result["fid"] == pytest.approx(frechet_distance(samples_stats, reference), rel=1e-9)
    assert result["fid"] > 0
    assert (result["inception_score"], result["inception_score_std"]) == pytest.approx(
        inception_score(logits, split_size=10), rel=1e-6
    )

    with_pr = evaluate_samples(
        path,
        reference,
        FakeExtractor(),
        reference_features=ref_pool,
        spatial_reference=FeatureStats(ref_spatial.mean(0), np.cov(ref_spatial, rowvar=False), 50),
        min_samples=5,
        split_size=10,
        prc_distance_dtype="float64",
    )
    assert set(with_pr) == set(result) | {"precision", "recall", "sfid", "kid_mean", "kid_std"}
    assert (with_pr["precision"], with_pr["recall"]) == pytest.approx(
        brute_force_precision_recall(ref_pool, pool.astype(np.float32), k=3), abs=1e-12
    )
    # KID is torch-fidelity's, over subsets capped by the smaller set (40 samples here)
    from torch_fidelity.metric_kid import kid_features_to_metric

    expected = kid_features_to_metric(
        torch.from_numpy(ref_pool),
        torch.from_numpy(pool.astype(np.float32)),
        kid_subsets=100,
        kid_subset_size=40,
        rng_seed=0,
        verbose=False,
    )
    assert with_pr["kid_mean"] == pytest.approx(expected["kernel_inception_distance_mean"], rel=1e-9)
    assert with_pr["fid"] == pytest.approx(result["fid"], rel=1e-12) and with_pr["sfid"] > 0


def test_evaluate_samples_against_its_own_statistics_is_perfect(tmp_path):
    samples = random_images(30, seed=12)
    np.savez(tmp_path / "samples.npz", samples)
    pool = direct_features(samples, None)[0]
    result = evaluate_samples(
        tmp_path / "samples.npz",
        FeatureStats(pool.mean(0), np.cov(pool, rowvar=False), 30),
        FakeExtractor(),
        reference_features=pool,
        min_samples=5,
        split_size=10,
    )
    assert abs(result["fid"]) < 1e-8
    assert (result["precision"], result["recall"]) == (1.0, 1.0)


def test_evaluate_samples_refuses_too_few_samples_before_extracting(tmp_path):
    np.savez(tmp_path / "samples.npz", random_images(40, seed=13))
    extractor = FakeExtractor()
    reference = FeatureStats(np.zeros(4), np.eye(4), 10)
    with pytest.raises(
        ValueError,
        match=r"FID over 4 feature dimensions needs at least 41 samples, .*holds 40; "
        r"raise sampling.num_samples\.",
    ):
        evaluate_samples(tmp_path / "samples.npz", reference, extractor, min_samples=41)
    inception = FeatureStats(np.zeros(2048), np.eye(2048), 10)
    with pytest.raises(ValueError, match=r"at least 2049 samples"):  # the default: the reference's 2048 dims + 1
        evaluate_samples(tmp_path / "samples.npz", inception, extractor)
    # fewer feature dimensions: the fix names both knobs
    with pytest.raises(
        ValueError,
        match=r"FID over 100 feature dimensions needs at least 101 samples, .*"
        r"raise sampling.num_samples or lower eval_gen.feature_dims\.",
    ):
        evaluate_samples(tmp_path / "samples.npz", inception, extractor, feature_dims=100)
    assert extractor.batch_sizes == []
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        evaluate_samples(tmp_path / "missing.npz", reference, extractor, min_samples=5)


# --------------------------------------------------------------------------- the real Inception network


def no_network(*args, **kwargs):
    raise AssertionError("must not download")


@pytest.fixture(scope="module")
def random_inception_weights(tmp_path_factory):
    """A state dict in exactly the format torch-fidelity loads, with random weights: the real file is not here."""
    return write_random_inception(tmp_path_factory.mktemp("inception") / "weights-inception-2015-12-05-6726825d.pth")


def test_inception_features_from_a_local_file_give_pool_logits_and_spatial_features(
    random_inception_weights, monkeypatch
):
    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", no_network)
    extractor = InceptionFeatures(random_inception_weights, "cpu", batch_size=3)
    blocks = []
    extractor.network.Mixed_6d.register_forward_hook(lambda module, inputs, output: blocks.append(output.clone()))
    images = torch.from_numpy(random_images(4, seed=14, side=256)).permute(0, 3, 1, 2)

    pool, logits, spatial = extractor.extract(images)
    assert pool.shape == (4, 2048) and pool.dtype == np.float64
    assert logits.shape == (4, 1008) and spatial.shape == (4, SPATIAL_FEATURE_DIM)
    assert np.isfinite(pool).all() and np.isfinite(logits).all()
    assert not np.array_equal(pool[0], pool[1])
    # ADM's spatial features: mixed_6 block's first 7 channels (its 1x1 branch), flattened in NHWC order
    block = torch.cat(blocks)
    assert block.shape == (4, 768, 17, 17)
    np.testing.assert_array_equal(spatial, block[:, :7].permute(0, 2, 3, 1).reshape(4, -1).double().numpy())

    pool_again, logits_again = extractor(images)  # deterministic
    np.testing.assert_array_equal(pool_again, pool)
    np.testing.assert_array_equal(logits_again, logits)


def test_inception_features_with_a_missing_weights_file_fail_clearly_without_downloading(tmp_path, monkeypatch):
    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", no_network)
    missing = tmp_path / "weights-inception-2015-12-05-6726825d.pth"
    with pytest.raises(FileNotFoundError, match=r"Inception weights not found at .*pass its path as weights_path"):
        InceptionFeatures(missing, "cpu")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with pytest.raises(FileNotFoundError, match=r"torch_home/hub/checkpoints/weights-inception-2015-12-05-6726825d"):
        InceptionFeatures(None, "cpu")


# --------------------------------------------------------------------------- ADM's evaluator, transcribed
# openai/guided-diffusion evaluations/evaluator.py, written out with numpy / scipy so that our evaluator can be
# held to it on the same features: FIDStatistics.frechet_distance, Evaluator.compute_inception_score,
# ManifoldEstimator.manifold_radii / evaluate_pr and DistanceBlock (float16, float32 where not finite).


def adm_frechet_distance(mu1, sigma1, mu2, sigma2, eps=1e-6):
    from scipy import linalg

    diff = mu1 - mu2
    covmean, _ = linalg.sqrtm(sigma1.dot(sigma2), disp=False)
    if not np.isfinite(covmean).all():
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    return diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean)


def adm_inception_score(logits, split_size):
    preds = np.exp(logits - logits.max(axis=1, keepdims=True))
    preds = preds / preds.sum(axis=1, keepdims=True)  # the graph's softmax
    scores = []
    for i in range(0, len(preds), split_size):
        part = preds[i : i + split_size]
        kl = part * (np.log(part) - np.log(np.expand_dims(np.mean(part, 0), 0)))
        scores.append(np.exp(np.mean(np.sum(kl, 1))))
    return float(np.mean(scores))


def adm_pairwise_distances(U, V):
    def block(u, v):  # _batch_pairwise_distances
        norm_u = (u * u).sum(1).reshape(-1, 1)
        norm_v = (v * v).sum(1).reshape(1, -1)
        return torch.clamp(norm_u - 2 * u @ v.T + norm_v, min=0.0)

    u, v = torch.from_numpy(U), torch.from_numpy(V)
    d16 = block(u.half(), v.half())
    return (d16.float() if torch.isfinite(d16).all() else block(u.float(), v.float())).numpy()


def adm_precision_recall(ref, sample, k=3, batch=10000):
    def radii(features):
        out = np.zeros([len(features), 1], dtype=np.float32)
        for b1 in range(0, len(features), batch):
            d = np.concatenate(
                [
                    adm_pairwise_distances(features[b1 : b1 + batch], features[b2 : b2 + batch])
                    for b2 in range(0, len(features), batch)
                ],
                axis=1,
            )
            out[b1 : b1 + batch] = np.partition(d, k, axis=1)[:, [k]]
        return out

    r1, r2 = radii(ref), radii(sample)
    status1 = np.zeros([len(ref), 1], dtype=bool)
    status2 = np.zeros([len(sample), 1], dtype=bool)
    for b1 in range(0, len(ref), batch):
        for b2 in range(0, len(sample), batch):
            d = adm_pairwise_distances(ref[b1 : b1 + batch], sample[b2 : b2 + batch])[..., None]
            status1[b1 : b1 + batch] |= np.any(d <= r2[b2 : b2 + batch], axis=1)
            status2[b2 : b2 + batch] |= np.any(d <= r1[b1 : b1 + batch][:, None], axis=0)
    return float(np.mean(status2)), float(np.mean(status1))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::scipy.linalg.LinAlgWarning")
def test_our_evaluator_equals_adms_formulas_on_an_adm_format_reference_batch(
    random_inception_weights, tmp_path, monkeypatch
):
    """A reference .npz with ADM's keys and dtypes, random-weight Inception features: FID, sFID, IS and P/R."""
    monkeypatch.setattr(tf_inception, "load_state_dict_from_url", no_network)
    extractor = InceptionFeatures(random_inception_weights, "cpu", batch_size=8)
    reference_images, sample_images = random_images(24, seed=20, side=64), random_images(20, seed=21, side=64)
    to_nchw = lambda a: torch.from_numpy(a).permute(0, 3, 1, 2)  # noqa: E731
    ref_pool, _, ref_spatial = extractor.extract(to_nchw(reference_images))
    # ADM's statistics cover the whole training set, not only the batch's images: a full-rank stand-in
    rng = np.random.default_rng(5)
    wide = ref_pool.mean(0) + rng.normal(scale=ref_pool.std(), size=(3000, ref_pool.shape[1]))
    wide_s = ref_spatial.mean(0) + rng.normal(scale=ref_spatial.std(), size=(3000, ref_spatial.shape[1]))
    reference = tmp_path / "VIRTUAL_tiny_labeled.npz"
    np.savez(
        reference,
        arr_0=reference_images,
        mu=wide.mean(0),
        sigma=np.cov(wide, rowvar=False),
        mu_s=wide_s.mean(0),
        sigma_s=np.cov(wide_s, rowvar=False),
    )
    samples = tmp_path / "samples.npz"
    np.savez(samples, sample_images, np.arange(20))

    ours = evaluate_samples(
        samples,
        load_adm_reference(reference),
        extractor,
        reference_features=adm_reference_features(reference, extractor),
        spatial_reference=load_adm_reference(reference, spatial=True),
        min_samples=5,
        split_size=8,
        prc_distance_dtype="float16",
    )

    with np.load(reference) as ref:
        mu, sigma, mu_s, sigma_s = ref["mu"], ref["sigma"], ref["mu_s"], ref["sigma_s"]
    pool, logits, spatial = extractor.extract(to_nchw(sample_images))
    assert ours["fid"] == pytest.approx(
        adm_frechet_distance(pool.mean(0), np.cov(pool, rowvar=False), mu, sigma), rel=1e-6
    )
    assert ours["sfid"] == pytest.approx(
        adm_frechet_distance(spatial.mean(0), np.cov(spatial, rowvar=False), mu_s, sigma_s), rel=1e-6
    )
    assert ours["inception_score"] == pytest.approx(adm_inception_score(logits.astype(np.float64), 8), rel=1e-6)
    assert (ours["precision"], ours["recall"]) == adm_precision_recall(
        ref_pool.astype(np.float32), pool.astype(np.float32)
    )
    assert ours["num_samples"] == 20 and ours["fid"] > 0 and ours["sfid"] > 0


def adm_format_batch(path, images, pool, spatial):
    """An .npz with the keys and dtypes of ADM's VIRTUAL_*.npz: uint8 images, float64 statistics."""
    np.savez(
        path,
        arr_0=images,
        mu=pool.mean(0),
        sigma=np.cov(pool, rowvar=False),
        mu_s=spatial.mean(0),
        sigma_s=np.cov(spatial, rowvar=False),
    )


def test_the_reference_is_adms_batch_and_our_own_statistics_sit_beside_it_with_the_fid_between(tmp_path):
    ref_images, train_images = random_images(30, seed=30), random_images(40, seed=31)
    ref_pool, _, ref_spatial = direct_features(ref_images, None)
    adm = tmp_path / "VIRTUAL_tiny_labeled.npz"
    adm_format_batch(adm, ref_images, ref_pool + 0.5, ref_spatial)  # statistics that are not the images' own
    extractor = FakeExtractor()

    def own():
        batches = (torch.from_numpy(train_images[i : i + 7]).permute(0, 3, 1, 2) for i in range(0, 40, 7))
        stats, kept, spatial = reference_from_images(batches, extractor, keep_features=10, seed=0, spatial=True)
        return stats, kept, spatial, "the training images"

    out = tmp_path / "both"
    out.mkdir()
    info = write_reference(out, extractor, adm_npz=adm, own=own)
    assert info["reference"] == "adm" and info["own_source"] == "the training images"
    np.testing.assert_allclose(FeatureStats.load(out / "stats.npz").mu, (ref_pool + 0.5).mean(0))
    np.testing.assert_allclose(np.load(out / "features.npy"), ref_pool.astype(np.float32), rtol=1e-6)  # ADM's images
    own_stats = FeatureStats.load(out / "own_stats.npz")
    assert own_stats.num == 40
    assert info["fid_between_references"] == pytest.approx(
        frechet_distance(own_stats, FeatureStats.load(out / "stats.npz")), rel=1e-12
    )
    assert info["fid_between_references"] > 0 and info["sfid_between_references"] > 0

    alone = tmp_path / "adm_only"
    alone.mkdir()
    assert "fid_between_references" not in write_reference(alone, extractor, adm_npz=adm, own=None)
    assert not (alone / "own_stats.npz").exists()
    ours = tmp_path / "own_only"
    ours.mkdir()
    assert write_reference(ours, extractor, adm_npz=None, own=own)["reference"] == "own"


def test_a_missing_adm_batch_is_one_sentence_with_where_to_get_it_and_no_output(tmp_path):
    import subprocess
    import sys

    import yaml

    from vcarepro.params.config import compose

    params = compose(["scale=paper"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    root = ROOT
    result = subprocess.run(
        [sys.executable, str(root / "stages" / "fid_reference.py")], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 2  # a user error, as every other
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: fid_reference: ")
    assert "weights/VIRTUAL_imagenet256_labeled.npz is missing" in lines[0]
    assert "https://openaipublic.blob.core.windows.net/diffusion/jul-2021/ref_batches/imagenet/256/" in lines[0]
    assert "fid_reference.adm_npz=null" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_fid_over_fewer_feature_dimensions_is_the_fid_of_the_leading_coordinates(tmp_path):
    """Issue 21 (3): a smoke evaluation of a few samples: FID / sFID over the first k coordinates only."""
    samples, reference_images = random_images(12, seed=20), random_images(50, seed=21)
    np.savez(tmp_path / "samples.npz", samples)
    ref_pool, _, ref_spatial = direct_features(reference_images, None)
    pool, _, spatial = direct_features(samples, None)
    k = 3
    reference = FeatureStats(ref_pool.mean(0), np.cov(ref_pool, rowvar=False), 50)
    spatial_reference = FeatureStats(ref_spatial.mean(0), np.cov(ref_spatial, rowvar=False), 50)
    result = evaluate_samples(
        tmp_path / "samples.npz",
        reference,
        FakeExtractor(),
        reference_features=ref_pool,
        spatial_reference=spatial_reference,
        feature_dims=k,
        split_size=4,
    )
    lead = FeatureStats(pool[:, :k].mean(0), np.cov(pool[:, :k], rowvar=False), 12)
    assert result["fid"] == pytest.approx(frechet_distance(lead, reference.leading(k)), rel=1e-9)
    lead_spatial = FeatureStats(spatial[:, :k].mean(0), np.cov(spatial[:, :k], rowvar=False), 12)
    assert result["sfid"] == pytest.approx(frechet_distance(lead_spatial, spatial_reference.leading(k)), rel=1e-9)
    assert result["fid_feature_dims"] == k
    # precision / recall keep every coordinate
    assert (result["precision"], result["recall"]) == pytest.approx(
        brute_force_precision_recall(ref_pool, pool.astype(np.float32), k=3), abs=1e-12
    )
    # more dimensions than the extractor has: all of them, as without the knob
    full = evaluate_samples(
        tmp_path / "samples.npz", reference, FakeExtractor(), feature_dims=10_000, min_samples=5, split_size=4
    )
    assert full["fid_feature_dims"] == reference.dim
