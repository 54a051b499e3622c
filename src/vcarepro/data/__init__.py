"""Datasets: the on-disk layout every scale shares, and its sources (embedded digits, ImageNet)."""

FLOOR = 1
