"""Shared test set-up: DVC never phones home; a fixture for tests of tiny models."""
import os

import pytest
import torch

os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the
    threads' contention made such tests about 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
