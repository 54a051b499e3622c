"""Sample files in the ADM evaluator's format, written batch by batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vcarepro.data.samples import NpzSampleWriter, read_samples


def test_samples_written_out_of_order_read_back_as_adm_arrays(tmp_path):
    images = torch.randint(0, 256, (10, 3, 4, 5), dtype=torch.uint8)
    labels = torch.arange(10) % 3
    writer = NpzSampleWriter(tmp_path / "seed_0.npz", 10, (4, 5, 3))
    writer.write(6, images[6:], labels[6:])
    assert not (tmp_path / "seed_0.npz").exists()  # nothing finished-looking before close()
    writer.write(0, images[:6], labels[:6])
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed_0.npz"]  # the memory maps are gone
    with np.load(tmp_path / "seed_0.npz", allow_pickle=False) as data:
        assert data.files == ["arr_0", "arr_1"] and data["arr_0"].shape == (10, 4, 5, 3)
    got, got_labels = read_samples(tmp_path / "seed_0.npz")
    assert np.array_equal(got, images.permute(0, 2, 3, 1).numpy()) and np.array_equal(got_labels, labels.numpy())


def test_sample_files_that_are_missing_or_not_images_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the sample_gen stage"):
        read_samples(tmp_path / "absent.npz")
    np.savez(tmp_path / "floats.npz", np.zeros((2, 4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="arr_0 must be uint8"):
        read_samples(tmp_path / "floats.npz")
    np.savez(tmp_path / "other.npz", images=np.zeros((2, 4, 4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="has no arr_0"):
        read_samples(tmp_path / "other.npz")
