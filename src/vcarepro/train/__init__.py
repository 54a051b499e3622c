"""Training: classification (DeiT recipe), diffusion (DiT), flow (SiT), sampling, checkpoints, seed workers, and
the distributed launcher (launch, torch-free: it starts the ranks)."""

FLOOR = 3
