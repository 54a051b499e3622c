"""ADM-format image files read a batch at a time: every .npy header version numpy writes, stored or deflated, gives
numpy's own array; a truncated, Fortran-ordered or foreign file is one sentence naming the fix."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format

from vcarepro.metrics.npz_images import iter_npz_images, npz_array_shape, npz_keys, npz_num_images


def random_images(n, seed, side=8):
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)


def npy_bytes(array, version) -> bytes:
    buffer = io.BytesIO()
    npy_format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


def npz_of(path, members, compression=zipfile.ZIP_STORED):
    """An .npz as np.savez lays it out (one ``NAME.npy`` member per array), from raw member bytes."""
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(f"{name}.npy", data)
    return path


def test_npz_images_stream_in_batches_from_plain_and_compressed_files(tmp_path):
    images = random_images(23, seed=9)
    np.savez(tmp_path / "plain.npz", images)
    np.savez_compressed(tmp_path / "packed.npz", images)
    np.save(tmp_path / "array.npy", images)
    for name in ("plain.npz", "packed.npz", "array.npy"):
        batches = list(iter_npz_images(tmp_path / name, 10))
        assert [len(b) for b in batches] == [10, 10, 3]
        np.testing.assert_array_equal(np.concatenate(batches), images)
        assert npz_num_images(tmp_path / name) == 23


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_every_header_version_streams_to_what_numpy_itself_reads(tmp_path, version, compression):
    images = random_images(11, seed=1, side=5)
    data = npy_bytes(images, version)
    assert data[6:8] == bytes(version)  # the member really carries that header version
    path = npz_of(tmp_path / "samples.npz", {"arr_0": data, "labels": npy_bytes(np.arange(11), (1, 0))}, compression)
    with np.load(path, allow_pickle=False) as theirs:
        expected = theirs["arr_0"]
    batches = list(iter_npz_images(path, 4))
    assert [len(b) for b in batches] == [4, 4, 3]
    assert all(b.dtype == np.uint8 and b.flags.c_contiguous for b in batches)
    np.testing.assert_array_equal(np.concatenate(batches), expected)
    assert npz_array_shape(path, "arr_0") == expected.shape == (11, 5, 5, 3)
    assert npz_num_images(path) == 11
    assert npz_keys(path) == ["arr_0", "labels"]


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_a_plain_npy_file_of_either_header_version_is_read_by_numpy(tmp_path, version):
    images = random_images(7, seed=2)
    path = tmp_path / "samples.npy"
    path.write_bytes(npy_bytes(images, version))
    np.testing.assert_array_equal(np.concatenate(list(iter_npz_images(path, 3))), images)
    assert npz_num_images(path) == 7


def test_a_truncated_member_names_where_it_ends(tmp_path):
    images = random_images(11, seed=3)
    data = npy_bytes(images, (1, 0))
    path = npz_of(tmp_path / "cut.npz", {"arr_0": data[: -images[0].nbytes // 2]}, zipfile.ZIP_DEFLATED)
    assert npz_num_images(path) == 11  # the header still says 11
    stream = iter_npz_images(path, 4)
    assert len(next(stream)) == 4 and len(next(stream)) == 4
    with pytest.raises(ValueError, match=r"ends after 8 of 11 images; the file is truncated"):
        next(stream)


def test_fortran_order_foreign_versions_and_non_zips_are_refused_with_the_fix(tmp_path):
    np.savez(tmp_path / "fortran.npz", np.asfortranarray(random_images(4, seed=4)))
    with pytest.raises(ValueError, match=r"stored in Fortran order.*np.ascontiguousarray"):
        list(iter_npz_images(tmp_path / "fortran.npz", 2))
    future = npy_format.MAGIC_PREFIX + bytes([9, 0]) + b"\x00" * 64
    npz_of(tmp_path / "future.npz", {"arr_0": future})
    with pytest.raises(ValueError, match=r"Unsupported .npy format version \(9, 0\)"):
        npz_num_images(tmp_path / "future.npz")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"is not an .npz \(zip\) file"):
        npz_num_images(tmp_path / "text.npz")
    with pytest.raises(FileNotFoundError, match=r"missing.npz; run the sampling stage first"):
        npz_num_images(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        list(iter_npz_images(tmp_path / "fortran.npz", 0))


def test_npz_images_reject_non_image_arrays(tmp_path):
    np.savez(tmp_path / "floats.npz", np.zeros((4, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match=r"not uint8 \(N, H, W, 3\) images"):
        list(iter_npz_images(tmp_path / "floats.npz", 2))
    np.savez(tmp_path / "named.npz", images=np.zeros((4, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"has no 'arr_0' array \(keys: \['images'\]\)"):
        list(iter_npz_images(tmp_path / "named.npz", 2))
