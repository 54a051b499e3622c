"""torch-fidelity's ``inception-v3-compat`` network as ADM's evaluator reads it: pool features, logits, sFID features.

IS logits are pool features times the final weights, no bias (ADM's ``softmax/logits/MatMul``). sFID reads
the first 7 channels of TF's ``mixed_6/conv``, which torch-fidelity's weight converter maps onto
``Mixed_6d.branch1x1``: a hook keeps channels 0..6 in TF's NHWC order, so they line up with ADM's ``mu_s``.
Not yet checked against the real weights: the first run with them should compare ADM's spatial statistics
(:func:`~vcarepro.metrics.fid_reference.load_adm_reference`) with
:func:`~vcarepro.metrics.fid_reference.reference_from_images` on the same images.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

from vcarepro.core.errors import BadInput, MissingInput
from vcarepro.metrics.digit_features import (
    INCEPTION_EXTRACTOR,
    INCEPTION_FEATURE_DIM,
    INCEPTION_WEIGHTS_FILENAME,
    default_inception_weights_path,
)

INCEPTION_NUM_LOGITS = 1008  # the 2015 graph's softmax has 1008 outputs (1000 classes and 8 unused)
SPATIAL_CHANNELS = 7  # ADM: spatial = mixed_6/conv[..., :7]
SPATIAL_GRID = 17  # mixed_6 works at 17 x 17 for a 299 px input
SPATIAL_FEATURE_DIM = SPATIAL_CHANNELS * SPATIAL_GRID * SPATIAL_GRID  # 2023
SPATIAL_MODULE = "Mixed_6d.branch1x1"  # torch-fidelity's name for TF's mixed_6/conv


class InceptionOutputs(NamedTuple):
    pool: np.ndarray  # (B, 2048) float64, pool_3
    logits: np.ndarray  # (B, 1008) float32, unbiased logits
    spatial: np.ndarray  # (B, 2023) float64, mixed_6/conv[..., :7] flattened in NHWC order


class InceptionFeatures:
    """torch-fidelity's ``inception-v3-compat`` network from a local weights file, as ADM's evaluator uses it.

    ``weights_path``: torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth``;
    None looks in torch hub's checkpoint directory. Nothing is ever
    downloaded. Calling it on uint8 (B, 3, H, W) images returns
    ``(pool (B, 2048) float64, logits_unbiased (B, 1008) float32)``; the
    network resizes to 299 px itself, the TF1 way. :meth:`extract` also
    returns ADM's sFID features.
    """

    feature_dim = INCEPTION_FEATURE_DIM
    num_logits = INCEPTION_NUM_LOGITS
    spatial_dim = SPATIAL_FEATURE_DIM

    def __init__(
        self,
        weights_path: Optional[Union[str, Path]] = None,
        device: Union[str, torch.device] = "cpu",
        batch_size: int = 100,
    ):
        path = Path(weights_path) if weights_path is not None else default_inception_weights_path()
        if not path.is_file():
            raise MissingInput(
                f"Inception weights not found at {path}; copy {INCEPTION_WEIGHTS_FILENAME} (from "
                "torch-fidelity's v0.2.0 GitHub release) there or pass its path as weights_path."
            )
        if batch_size < 1:
            raise BadInput(f"batch_size must be >= 1, got {batch_size}; pass a positive number of images per pass.")
        self.weights_path = path
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        # built as torch-fidelity's create_feature_extractor builds it, minus its hard-wired .cuda()
        self.network = FeatureExtractorInceptionV3(
            INCEPTION_EXTRACTOR, ["2048", "logits_unbiased"], feature_extractor_weights_path=str(path)
        )
        self.network.requires_grad_(False).eval().to(self.device)
        self._spatial: Optional[torch.Tensor] = None
        self.network.get_submodule(SPATIAL_MODULE).register_forward_hook(self._keep_spatial)

    def _keep_spatial(self, module, inputs, output: torch.Tensor) -> None:
        # TF's [..., :7] on NHWC, flattened as ADM does (reshape([N, -1]) on NHWC): H, W, then channel
        self._spatial = output[:, :SPATIAL_CHANNELS].permute(0, 2, 3, 1).reshape(output.shape[0], -1)

    @torch.inference_mode()
    def extract(self, images_uint8: Union[np.ndarray, torch.Tensor]) -> InceptionOutputs:
        """Pool features, unbiased logits and spatial (sFID) features of uint8 (B, 3, H, W) images."""
        images = torch.as_tensor(images_uint8)
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise BadInput(
                f"InceptionFeatures expects uint8 (B, 3, H, W) images, got {images.dtype} "
                f"{tuple(images.shape)}; convert NHWC arrays with .permute(0, 3, 1, 2)."
            )
        pools, logits, spatials = [], [], []
        for start in range(0, images.shape[0], self.batch_size):
            batch = images[start : start + self.batch_size].to(self.device, non_blocking=True).contiguous()
            self._spatial = None
            pool, logit = self.network(batch)
            if self._spatial is None:
                raise RuntimeError(
                    f"The forward hook on {SPATIAL_MODULE} did not fire; torch-fidelity's Inception "
                    "has changed layout, pin torch-fidelity 0.4 or update SPATIAL_MODULE."
                )
            pools.append(pool.double().cpu().numpy())
            logits.append(logit.float().cpu().numpy())
            spatials.append(self._spatial.double().cpu().numpy())
            self._spatial = None
        if not pools:
            return InceptionOutputs(
                np.zeros((0, self.feature_dim)),
                np.zeros((0, self.num_logits), np.float32),
                np.zeros((0, self.spatial_dim)),
            )
        return InceptionOutputs(np.concatenate(pools), np.concatenate(logits), np.concatenate(spatials))

    def __call__(self, images_uint8: Union[np.ndarray, torch.Tensor]) -> Tuple[np.ndarray, np.ndarray]:
        outputs = self.extract(images_uint8)
        return outputs.pool, outputs.logits
