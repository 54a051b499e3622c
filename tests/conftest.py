"""Shared test set-up: DVC never phones home; fixtures for tests of tiny models and for tests that must not reach a network."""
import os
import socket

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


@pytest.fixture
def network_attempts(monkeypatch):
    """Every connection attempted during the test (each one refused)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts
