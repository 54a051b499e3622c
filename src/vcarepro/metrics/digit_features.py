"""The embedded scale's FID features: a digit classifier registered with torch-fidelity as a feature extractor.

Inception features of 8x8 digits upsampled to 299 px would measure upsampling artefacts (and its weights
are not offline), so :class:`DigitFeatureNet`'s penultimate layer plays pool3's role; its numbers compare
only with numbers from the same weights file. :func:`compute_generation_metrics` also takes
``"inception-v3-compat"``, never downloaded. The paper scale's FID-50K is :mod:`vcarepro.metrics.evaluator`.

torch-fidelity's extractor contract (v0.4.0, read from its source): ``cls(name, features_list, **kwargs)``;
``forward`` gets uint8 Bx3xHxW and returns one float tensor per name of ``features_list``, in that order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_fidelity
from safetensors import safe_open
from safetensors.torch import load_file
from torch.utils.data import Dataset
from torch_fidelity.feature_extractor_base import FeatureExtractorBase
from torch_fidelity.registry import FEATURE_EXTRACTORS_REGISTRY

from vcarepro.core.errors import BadInput
from vcarepro.core.io import safetensors_bytes, write_bytes
from vcarepro.core.progress import Progress

DIGITS_EXTRACTOR = "vcarepro-digits"
INCEPTION_EXTRACTOR = "inception-v3-compat"
INCEPTION_WEIGHTS_FILENAME = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_FEATURE_DIM = 2048
KID_MAX_SUBSET_SIZE = 1000  # torch-fidelity's default; smaller sets use all their samples per subset

_FORMAT = "vcarepro.DigitFeatureNet"  # marks our safetensors files, so a wrong file fails clearly

ImageArray = Union[np.ndarray, torch.Tensor]


# --------------------------------------------------------------------------- the digit classifier


class DigitFeatureNet(nn.Module):
    """Small CNN digit classifier whose penultimate layer is the embedded-scale FID feature space.

    Input: float images in [0, 1], (B, C, H, W), C in {1, 3}. Colour inputs are
    reduced to their channel mean, so a grayscale image and the same image
    repeated to three channels (what torch-fidelity feeds) give the same
    features. Every input is resized to ``input_size`` so that samples at any
    resolution land in one feature space.
    """

    def __init__(self, *, input_size: int = 32, width: int = 32, feature_dim: int = 64, num_classes: int = 10):
        super().__init__()
        if input_size < 8 or width % 8 != 0:
            raise BadInput(
                f"DigitFeatureNet needs input_size >= 8 and width divisible by 8 (GroupNorm's 8 groups), "
                f"got input_size={input_size}, width={width}; change them accordingly."
            )
        self.config = dict(input_size=input_size, width=width, feature_dim=feature_dim, num_classes=num_classes)
        self.input_size = input_size
        self.feature_dim = feature_dim
        # halve the map down to about 2x2 so the pooled units see the whole digit: pooling
        # local features that each see a corner only would discard the digit's shape
        channels = [width] + [min(2 ** (i + 1), 4) * width for i in range(input_size.bit_length() - 2)]
        blocks = [_conv_block(1, channels[0], stride=1)]
        blocks += [_conv_block(cin, cout, stride=2) for cin, cout in zip(channels, channels[1:])]
        self.trunk = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        # features are taken before the ReLU: rectified units that never fire would make
        # the feature covariance singular, and half-rectified ones are far from Gaussian
        self.embed = nn.Linear(channels[-1], feature_dim)
        self.head = nn.Linear(feature_dim, num_classes)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise BadInput(
                f"DigitFeatureNet expects (B, 1 or 3, H, W) images, got {tuple(x.shape)}; "
                "add a channel axis or convert to grayscale/RGB first."
            )
        x = x.float().mean(dim=1, keepdim=True)
        if x.shape[-2:] != (self.input_size, self.input_size):
            # antialias keeps downsized large samples from aliasing into features small ones do not have
            x = F.interpolate(
                x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False, antialias=True
            )
        return (x - 0.5) / 0.5

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate layer before its ReLU, (B, feature_dim)."""
        return self.embed(self.trunk(self._prepare(x)))

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """Logits from :meth:`features`."""
        return self.head(F.relu(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(x))


def _conv_block(cin: int, cout: int, *, stride: int) -> nn.Sequential:
    # GroupNorm rather than BatchNorm: features must not depend on batch composition or train/eval mode
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.GroupNorm(8, cout), nn.ReLU(inplace=True)
    )


def train_feature_net(
    images_uint8: ImageArray,
    labels: ImageArray,
    *,
    epochs: int = 6,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    input_size: int = 32,
    width: int = 32,
    feature_dim: int = 64,
    num_classes: Optional[int] = None,
) -> Tuple[DigitFeatureNet, float]:
    """Train a :class:`DigitFeatureNet` on uint8 (N, C, H, W) images; returns the net (eval mode) and its train
    accuracy.

    ``num_classes`` defaults to ``max(labels) + 1``. Deterministic on CPU for a
    given seed: initialisation and shuffling draw from RNGs seeded with
    ``seed``, and the caller's global RNG state is restored afterwards.
    """
    images = _as_uint8_images(images_uint8, "images_uint8")
    targets = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if targets.shape != (images.shape[0],):
        raise BadInput(
            f"labels must have shape ({images.shape[0]},) to match the images, got {tuple(targets.shape)}; "
            "pass one integer class per image."
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = DigitFeatureNet(
            input_size=input_size,
            width=width,
            feature_dim=feature_dim,
            num_classes=num_classes or int(targets.max()) + 1,
        )
    generator = torch.Generator().manual_seed(seed)
    inputs = images.float() / 255.0
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = -(-len(inputs) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch)
    net.train()
    epoch, loss = 0, None
    progress = Progress(
        "extractor training",
        epochs * steps_per_epoch,
        unit="step",
        images_per_step=batch_size,
        figures=lambda: {"epoch": f"{epoch + 1}/{epochs}", "loss": loss.item() if loss is not None else None},
    )  # read when a line is due only
    with progress:
        for epoch in range(epochs):
            order = torch.randperm(len(inputs), generator=generator)
            for start in range(0, len(inputs), batch_size):
                batch = order[start : start + batch_size]
                loss = F.cross_entropy(net(inputs[batch]), targets[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                progress.advance()
    net.eval()
    return net, evaluate_accuracy(net, images, targets)


@torch.no_grad()
def evaluate_accuracy(
    net: DigitFeatureNet, images_uint8: ImageArray, labels: ImageArray, *, batch_size: int = 512
) -> float:
    """Top-1 accuracy of ``net`` on uint8 (N, C, H, W) images."""
    images = _as_uint8_images(images_uint8, "images_uint8")
    targets = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    was_training = net.training
    net.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = net(images[start : start + batch_size].float() / 255.0)
        correct += int((logits.argmax(dim=1) == targets[start : start + batch_size]).sum())
    net.train(was_training)
    return correct / len(images)


def save_feature_net(net: DigitFeatureNet, path: Union[str, Path]) -> None:
    """Write weights and constructor config to one safetensors file, atomically (temp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # one file, config in the header: torch-fidelity hands an extractor exactly one path
    metadata = {"format": _FORMAT, "config": json.dumps(net.config, sort_keys=True)}
    write_bytes(path, safetensors_bytes(net.state_dict(), metadata))  # canonical header: same weights, same bytes


def read_feature_net_config(path: Union[str, Path]) -> Dict[str, int]:
    """Constructor config stored in a file written by :func:`save_feature_net`, read from the header only."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(
            f"Digit feature-net weights not found at {path}; train them with train_feature_net and "
            "save_feature_net, then pass that file as weights_path."
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as error:  # safetensors raises its own error types for non-safetensors files
        raise BadInput(
            f"{path} is not a safetensors file ({error}); pass a file written by save_feature_net."
        ) from None
    if metadata.get("format") != _FORMAT:
        raise BadInput(
            f"{path} was not written by save_feature_net (no '{_FORMAT}' header); "
            "pass a file written by save_feature_net."
        )
    return json.loads(metadata["config"])


def load_feature_net(path: Union[str, Path]) -> DigitFeatureNet:
    """Rebuild a :class:`DigitFeatureNet` (eval mode, no grad) from a file written by :func:`save_feature_net`."""
    net = DigitFeatureNet(**read_feature_net_config(path))
    net.load_state_dict(load_file(str(path)))
    net.requires_grad_(False)
    return net.eval()


# --------------------------------------------------------------------------- torch-fidelity extractor


class FeatureExtractorDigits(FeatureExtractorBase):
    """torch-fidelity wrapper of a trained :class:`DigitFeatureNet`; register with
    :func:`register_digit_feature_extractor`.

    Provides ``"features"`` (penultimate activations, used for FID, KID and
    PRC) and ``"logits"`` (used for the Inception Score).
    """

    def __init__(
        self, name: str, features_list: Sequence[str], feature_extractor_weights_path: Optional[str] = None, **kwargs
    ):
        super().__init__(name, features_list)
        if feature_extractor_weights_path is None:
            raise BadInput(
                f"Feature extractor '{name}' needs trained weights; pass feature_extractor_weights_path "
                "(a file written by vcarepro.metrics.digit_features.save_feature_net)."
            )
        self.net = load_feature_net(feature_extractor_weights_path)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
            raise BadInput(
                f"Expected uint8 Bx3xHxW images, got {x.dtype} {tuple(x.shape)}; "
                "convert samples to uint8 RGB before extracting features."
            )
        features = self.net.features(x.float() / 255.0)
        out = {"features": features, "logits": self.net.classify(features)}
        return tuple(out[name].float() for name in self.features_list)

    @staticmethod
    def get_provided_features_list() -> Tuple[str, ...]:
        return "features", "logits"

    @staticmethod
    def get_default_feature_layer_for_metric(metric: str) -> str:
        return {"isc": "logits", "fid": "features", "kid": "features", "prc": "features"}[metric]

    @staticmethod
    def can_be_compiled() -> bool:
        return False  # too small to gain anything, and compilation would only add start-up time on CPU

    @staticmethod
    def get_dummy_input_for_compile() -> torch.Tensor:
        return torch.zeros(1, 3, 8, 8, dtype=torch.uint8)


def register_digit_feature_extractor(name: str = DIGITS_EXTRACTOR) -> None:
    """Register :class:`FeatureExtractorDigits` with torch-fidelity under ``name``; calling it again is a no-op."""
    registered = FEATURE_EXTRACTORS_REGISTRY.get(name)
    if registered is None:
        torch_fidelity.register_feature_extractor(name, FeatureExtractorDigits)
        return
    # compared by qualified name, not identity, so that re-importing this module stays a no-op
    if (registered.__module__, registered.__qualname__) != (
        FeatureExtractorDigits.__module__,
        FeatureExtractorDigits.__qualname__,
    ):
        raise BadInput(
            f"torch-fidelity already has a different feature extractor named '{name}' "
            f"({registered.__module__}.{registered.__qualname__}); register ours under another name."
        )


register_digit_feature_extractor()


# --------------------------------------------------------------------------- metrics


class UInt8ImageDataset(Dataset):
    """In-memory uint8 (N, C, H, W) images served as torch-fidelity wants them: uint8 3xHxW, grayscale repeated."""

    def __init__(self, images_uint8: ImageArray):
        self.images = _as_uint8_images(images_uint8, "images_uint8")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        image = self.images[index]
        return image.expand(3, -1, -1).contiguous() if image.shape[0] == 1 else image


def compute_generation_metrics(
    real_uint8: ImageArray,
    fake_uint8: ImageArray,
    *,
    extractor: str = DIGITS_EXTRACTOR,
    weights_path: Optional[Union[str, Path]] = None,
    kid_subset_size: Optional[int] = None,
    cuda: bool = False,
    seed: int = 0,
    batch_size: int = 256,
    verbose: bool = False,
) -> Dict[str, Union[float, int, str]]:
    """FID and KID between two sets of uint8 (N, C, H, W) images (C in {1, 3}, same H and W) via torch-fidelity.

    ``weights_path``: a :func:`save_feature_net` file for ``"vcarepro-digits"`` (required), torch-fidelity's
    Inception ``.pth`` for ``"inception-v3-compat"`` (None: torch hub's checkpoint directory, never downloaded).
    Each set needs ``feature_dim + 1`` images, else the covariance is singular and FID measures estimation bias.
    Nothing is cached: torch-fidelity's cache is keyed by input name, so a reused name would return stale numbers.
    """
    real = _as_uint8_images(real_uint8, "real_uint8")
    fake = _as_uint8_images(fake_uint8, "fake_uint8")
    if real.shape[-2:] != fake.shape[-2:]:
        raise BadInput(
            f"Real and fake images differ in size ({tuple(real.shape[-2:])} vs {tuple(fake.shape[-2:])}); "
            "resize one set to the other's resolution first."
        )
    weights = _resolve_weights(extractor, weights_path)
    _check_enough_samples(real.shape[0], fake.shape[0], _feature_dim(extractor, weights))
    if kid_subset_size is None:
        kid_subset_size = min(KID_MAX_SUBSET_SIZE, real.shape[0], fake.shape[0])
    if not 2 <= kid_subset_size <= min(real.shape[0], fake.shape[0]):
        raise BadInput(
            f"kid_subset_size={kid_subset_size} must lie in [2, {min(real.shape[0], fake.shape[0])}] "
            "(the smaller set's size); lower it or leave it None."
        )
    if cuda and not torch.cuda.is_available():
        raise BadInput("cuda=True but no CUDA device is available; pass cuda=False.")
    scores = torch_fidelity.calculate_metrics(
        input1=UInt8ImageDataset(real),
        input2=UInt8ImageDataset(fake),
        feature_extractor=extractor,
        feature_extractor_weights_path=str(weights),
        fid=True,
        kid=True,
        isc=False,
        prc=False,  # prc would load VGG16, which downloads its weights
        kid_subset_size=kid_subset_size,
        rng_seed=seed,
        cuda=cuda,
        batch_size=batch_size,
        cache=False,
        save_cpu_ram=True,  # in-memory data: DataLoader worker processes would only cost start-up time
        verbose=verbose,
    )
    return {
        "fid": float(scores[torch_fidelity.KEY_METRIC_FID]),
        "kid_mean": float(scores[torch_fidelity.KEY_METRIC_KID_MEAN]),
        "kid_std": float(scores[torch_fidelity.KEY_METRIC_KID_STD]),
        "num_real": int(real.shape[0]),
        "num_fake": int(fake.shape[0]),
        "extractor": extractor,
    }


def default_inception_weights_path() -> Path:
    """Where torch-fidelity's own downloader would cache the Inception weights: torch hub's checkpoint directory."""
    return Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_WEIGHTS_FILENAME


def _resolve_weights(extractor: str, weights_path: Optional[Union[str, Path]]) -> Path:
    if extractor == INCEPTION_EXTRACTOR:
        path = Path(weights_path) if weights_path is not None else default_inception_weights_path()
        if not path.is_file():
            raise BadInput(
                f"Inception weights not found at {path}; copy {INCEPTION_WEIGHTS_FILENAME} (from "
                "torch-fidelity's v0.2.0 GitHub release) there or pass its path as weights_path."
            )
        return path
    if extractor == DIGITS_EXTRACTOR:
        if weights_path is None:
            raise BadInput(
                "The digits extractor needs weights_path; train and save one with train_feature_net "
                "and save_feature_net, then pass that file."
            )
        path = Path(weights_path)
        if not path.is_file():
            raise BadInput(
                f"Digit feature-net weights not found at {path}; train them with train_feature_net and "
                "save_feature_net, then pass that file as weights_path."
            )
        return path
    raise BadInput(f"Unknown extractor '{extractor}'; use '{DIGITS_EXTRACTOR}' or '{INCEPTION_EXTRACTOR}'.")


def _feature_dim(extractor: str, weights: Path) -> int:
    if extractor == INCEPTION_EXTRACTOR:
        return INCEPTION_FEATURE_DIM
    return int(read_feature_net_config(weights)["feature_dim"])


def _check_enough_samples(num_real: int, num_fake: int, feature_dim: int) -> None:
    minimum = feature_dim + 1
    if min(num_real, num_fake) < minimum:
        raise BadInput(
            f"FID needs at least {minimum} images per set (feature dimension {feature_dim} + 1) but got "
            f"{num_real} real and {num_fake} fake; generate or load more images."
        )


def _as_uint8_images(images: ImageArray, what: str) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
    if not isinstance(tensor, torch.Tensor):
        raise BadInput(
            f"{what} must be a numpy array or torch tensor, got {type(images).__name__}; "
            "stack the images into one (N, C, H, W) uint8 array."
        )
    if tensor.dtype != torch.uint8:
        raise BadInput(
            f"{what} must be uint8 in [0, 255], got {tensor.dtype}; "
            "convert with (x * 255).round().clamp(0, 255).to(torch.uint8) or equivalent."
        )
    if tensor.dim() != 4 or tensor.shape[1] not in (1, 3) or tensor.shape[0] == 0:
        raise BadInput(
            f"{what} must have shape (N, C, H, W) with N >= 1 and C in (1, 3), got {tuple(tensor.shape)}; "
            "add the channel axis or move it to position 1."
        )
    return tensor.cpu()
