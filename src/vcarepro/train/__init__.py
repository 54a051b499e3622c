"""Training: classification (DeiT recipe), diffusion (DiT), flow (SiT), distributed launch, checkpoints."""

from .diffusion import GaussianDiffusion  # noqa: E402,F401  (DiT's DDPM objective and sampler)
from .flow import FlowMatching  # noqa: E402,F401  (SiT's flow-matching objective and samplers)
