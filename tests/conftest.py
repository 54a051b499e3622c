"""Shared test set-up: DVC never phones home, and tests are told apart from real runs."""
import os

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
