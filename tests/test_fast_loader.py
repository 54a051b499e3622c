"""The fast input path against the PIL path it replaces (timm's transform), op by op, draw by draw, image by image.

Stated tolerances, on the same image with the same parameters: every RandAugment op, the flip and the
normalization match Pillow / timm exactly (the device code follows Pillow's arithmetic); the crop-and-resize is
within one level on at most 0.5% of the pixels (its sums run in float32); a box decoded at a reduced DCT scale is
within 0.6 levels on average of Pillow's full-size resize; a whole image's augmentation, drawn with the same seeds,
differs from the PIL path's on at most 0.2% of its pixels. The erasing is timm's own RandomErasing.
"""

from __future__ import annotations

import io
import math
import os
import random
import resource
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image, ImageFile
from timm.data import auto_augment
from torch.utils.data import DataLoader

from helpers import flat_jpeg
from vcarepro.core.errors import BadInput
from vcarepro.data import device_ops, fast
from vcarepro.data.augment import posterize as pillow_safe_posterize
from vcarepro.data.folders import ManifestDataset, UnreadableImage, read_manifest, whole_files, write_manifest
from vcarepro.data.jpeg import decode_box, decode_full, image_size
from vcarepro.params.config import compose
from vcarepro.params.runs import cls_recipe
from vcarepro.tools.bench.loader import as_prepared, path_step, photographs, write_imagenet_like_jpegs
from vcarepro.train.classification import build_transforms

FILL = (124, 116, 104)  # timm's img_mean for ImageNet's mean, as create_transform gives RandAugment


@pytest.fixture(scope="module")
def recipe():
    return cls_recipe(compose(["scale=paper"]), "lab_deit_tiny").model_copy(update={"input_path": "fast"})


@pytest.fixture(scope="module")
def transform(recipe):
    return build_transforms(recipe, training=True)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_imagenet_like_jpegs(tmp_path_factory.mktemp("photos"), count=12)


@pytest.fixture(scope="module")
def squares():
    """Six 224 px parts of a photograph: what RandAugment sees after the crop."""
    photo = Image.open(photographs()[0]).convert("RGB")
    rng = random.Random(0)
    out = []
    for _ in range(6):
        x, y = rng.randint(0, photo.width - 224), rng.randint(0, photo.height - 224)
        out.append(photo.crop((x, y, x + 224, y + 224)))
    return out


def as_batch(images) -> torch.Tensor:
    return torch.stack([torch.from_numpy(np.array(i)).permute(2, 0, 1).float() for i in images])


def differing(a: torch.Tensor, b: torch.Tensor):
    """(the largest difference in levels, the share of pixels that differ)."""
    d = (a - b).abs()
    return d.max().item(), d.ne(0).float().mean().item()


# the op, its timm level function (levels 0, 2.5, 5, 9 and 10 give its arguments), whether it is geometric
LEVELLED = {
    "posterize": ("PosterizeIncreasing", "PosterizeOriginal"),
    "solarize": ("SolarizeIncreasing", "Solarize"),
    "solarize_add": ("SolarizeAdd",),
    "color": ("ColorIncreasing", "Color"),
    "contrast": ("ContrastIncreasing", "Contrast"),
    "brightness": ("BrightnessIncreasing", "Brightness"),
    "sharpness": ("SharpnessIncreasing", "Sharpness"),
    "rotate": ("Rotate",),
    "shear_x": ("ShearX",),
    "shear_y": ("ShearY",),
    "translate_x_rel": ("TranslateXRel",),
    "translate_y_rel": ("TranslateYRel",),
    "translate_x_abs": ("TranslateX",),
    "translate_y_abs": ("TranslateY",),
}
LEVELS = (0.0, 2.5, 5.0, 9.0, 10.0)


def op_arguments(op: str):
    """Every argument the op takes from its timm level functions at LEVELS, both signs where timm negates."""
    if op in ("auto_contrast", "equalize", "invert"):
        return [None]
    hparams = {"translate_const": 100, "img_mean": FILL}
    args = set()
    for name in LEVELLED[op]:
        for level in LEVELS:
            for draw in (0.4, 0.6):  # timm's _randomly_negate negates where random.random() > 0.5
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(auto_augment.random, "random", lambda draw=draw: draw)
                    args.add(auto_augment.LEVEL_TO_ARG[name](level, hparams)[0])
    return sorted(args)


@pytest.mark.parametrize("op", fast.OPS)
def test_each_randaugment_op_gives_timms_pil_pixels_at_every_level(op, squares):
    """Every op of the plan, at the arguments timm's levels give it (0 to 10, both signs), both interpolations for
    the geometric ones, against timm's PIL function on the same images: exact."""
    pil_op = {fn.__name__: fn for fn in auto_augment.NAME_TO_OP.values()}[op]
    pil_op = pillow_safe_posterize if op == "posterize" else pil_op
    batch = as_batch(squares)
    n = len(squares)
    for arg in op_arguments(op):
        for resample, code in ((Image.Resampling.BICUBIC, device_ops.BICUBIC), (Image.Resampling.BILINEAR, 0)):
            expected = as_batch(
                [
                    pil_op(img, *([] if arg is None else [arg]), fillcolor=FILL, resample=resample)
                    if op in device_ops.GEOMETRIC
                    else pil_op(img, *([] if arg is None else [arg]))
                    for img in squares
                ]
            )
            if op in device_ops.GEOMETRIC:
                matrix = torch.tensor([fast._affine_matrix(op, arg, 224)] * n, dtype=torch.float64)
                got = device_ops.affine(batch, matrix, torch.full((n,), code), torch.tensor(FILL))
            else:
                got = device_ops.PIXEL_OPS[op](batch, torch.full((n,), 0.0 if arg is None else float(arg)))
            assert differing(got, expected) == (0, 0), (op, arg, resample)
            if op not in device_ops.GEOMETRIC:
                break  # one interpolation is enough where none is used


def resized(crops, kind):
    pixels = torch.cat([torch.from_numpy(np.array(c)).reshape(-1) for c in crops])
    sizes = torch.tensor([[c.height, c.width] for c in crops])
    boxes = torch.tensor([[0, 0, c.width, c.height] for c in crops], dtype=torch.float64)
    return device_ops.resize_crops(pixels, sizes, boxes, torch.full((len(crops),), kind), 224)


@pytest.mark.parametrize("resample", ["bicubic", "bilinear"])
def test_the_crop_and_resize_match_pillows_within_a_level(resample):
    """Random crops of a photograph, wider and taller than the output, shrunk and enlarged, against Pillow's resize:
    at most one level apart, on at most 0.5% of the pixels (Pillow's fixed-point sums, here in float32)."""
    photo = Image.open(photographs()[1]).convert("RGB")
    rng = random.Random(1)
    crops = []
    for _ in range(24):
        w, h = rng.randint(40, photo.width), rng.randint(40, photo.height)
        x, y = rng.randint(0, photo.width - w), rng.randint(0, photo.height - h)
        crops.append(photo.crop((x, y, x + w, y + h)))
    filt = getattr(Image.Resampling, resample.upper())
    expected = as_batch([c.resize((224, 224), filt) for c in crops])
    worst, share = differing(resized(crops, device_ops.BICUBIC if resample == "bicubic" else 0), expected)
    assert worst <= 1 and share <= 0.005


def test_a_box_decoded_at_a_reduced_dct_scale_stays_within_a_level_of_pillows(tmp_path):
    """Crops of a large photograph that are at least 3x the output a side decode at 1/2 scale or less (fewer pixels:
    the point), and the resize from there differs from Pillow's full-size resize by at most 1.1 levels on average."""
    path = tmp_path / "large.JPEG"
    Image.open(photographs()[0]).convert("RGB").resize((1600, 1068), Image.Resampling.BICUBIC).save(path, quality=90)
    data = path.read_bytes()
    size = image_size(data, path)
    full = np.asarray(Image.open(path).convert("RGB"))
    rng = random.Random(0)
    scaled = []
    for _ in range(24):
        h = rng.randint(672, 1068)
        w = min(1600, max(672, int(h * rng.uniform(0.75, 1.33))))
        top, left = rng.randint(0, 1068 - h), rng.randint(0, 1600 - w)
        crop, box = decode_box(data, path, size, (top, left, h, w), 224)
        assert crop.shape[0] <= h / 2 + 1 and crop.shape[1] <= w / 2 + 1  # decoded at 1/2 or less
        got = device_ops.resize_crops(
            torch.from_numpy(crop).reshape(-1),
            torch.tensor([crop.shape[:2]]),
            torch.tensor([box], dtype=torch.float64),
            torch.tensor([device_ops.BICUBIC]),
            224,
        )
        expected = as_batch([Image.fromarray(full[top : top + h, left : left + w]).resize((224, 224), 3)])
        scaled.append((got - expected).abs().mean().item())
    assert max(scaled) <= 1.1, scaled


def test_the_flip_and_the_normalization_are_the_pil_paths_and_the_erasing_is_timms(transform):
    """A 224 px crop that the plan flips and augments no further comes back mirrored as Pillow mirrors it; the
    normalization is ToTensor's and Normalize's to within float32 rounding; the erasing is the transform's own
    RandomErasing, drawing on the device."""
    img = Image.open(photographs()[2]).convert("RGB").resize((224, 224))
    plan = fast.Plan(2)  # no RandAugment op applied
    item = (np.asarray(img), (0.0, 0.0, 224.0, 224.0), device_ops.BICUBIC, True, plan, 0)
    batch, _ = fast.collate([item], 224)
    draws = fast.Draws(transform)
    prefetcher = fast.DevicePrefetcher([], draws, torch.device("cpu"))  # as training builds it
    flipped = prefetcher.augment(batch)
    assert torch.equal(flipped, as_batch([img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]))
    normalize = next(t for t in transform.transforms if type(t).__name__ == "Normalize")
    ours = flipped.clone().sub_(prefetcher.mean).div_(prefetcher.std)
    assert (ours - normalize(flipped / 255.0)).abs().max().item() < 1e-5
    erasing = next(t for t in transform.transforms if type(t).__name__ == "RandomErasing")
    assert type(prefetcher.erasing) is type(erasing) and prefetcher.erasing.device == torch.device("cpu")
    assert {k: v for k, v in vars(prefetcher.erasing).items() if k != "device"} == {
        k: v for k, v in vars(erasing).items() if k != "device"
    }


class Recorded:
    """What timm's PIL transform drew for one image: the crop box, the interpolation, the flip, the ops."""

    def __init__(self, transform):
        self.transform, self.draws = transform, []
        crop = transform.transforms[0]
        get_params = crop.get_params
        self.box = lambda *a: self.draws.append(("box", get_params(*a))) or self.draws[-1][1]
        crop.get_params = self.box
        self.flip = transform.transforms[1]
        forward = self.flip.forward

        def flip(img):
            out = forward(img)
            self.draws.append(("flip", out is not img))
            return out

        self.flip.forward = flip
        for op in transform.transforms[2].ops:
            fn = op.aug_fn

            def record(img, *args, fn=fn, name=fn.__name__, **kwargs):
                if name in device_ops.GEOMETRIC:  # the interpolation drawn as the function itself draws it first
                    auto_augment._check_args_tf(kwargs)
                out = fn(img, *args, **kwargs)
                resample = kwargs.get("resample")
                self.draws.append(("op", name, args[0] if args else None, resample))
                return out

            op.aug_fn = record


def test_the_draws_are_timms_own_in_timms_order(tmp_path, photos):
    """With the same seeds, the fast path's draws for an image are exactly what timm's PIL transform draws for it:
    the crop box, the flip, each RandAugment op with its level, sign and interpolation (the cswin recipe draws a
    random interpolation for the crop and the ops)."""
    for name in ("lab_deit_tiny", "cswin"):
        recipe = cls_recipe(compose(["scale=paper"]), name).model_copy(update={"input_path": "fast"})
        pil = build_transforms(recipe, training=True)
        recorded = Recorded(pil)
        draws = fast.Draws(build_transforms(recipe, training=True))
        dataset = ManifestDataset(photos, "train")
        for i in range(60):
            img = Image.open(dataset.samples[i % len(dataset)][0].file).convert("RGB")
            random.seed(i), np.random.seed(i), torch.manual_seed(i)
            recorded.draws.clear()
            pil(img)
            random.seed(i), np.random.seed(i), torch.manual_seed(i)
            box, kind, flip, plan = draws(img.width, img.height)
            assert recorded.draws[0] == ("box", box) and recorded.draws[1] == ("flip", flip)
            ops = [d for d in recorded.draws if d[0] == "op"]
            layers = [(c, p, k) for c, p, k in zip(plan.codes, plan.params, plan.kinds) if c != fast.SKIPPED]
            assert [fast.OPS[code] for code, _, _ in layers] == [op for _, op, _, _ in ops]
            for (_, params, op_kind), (_, op, arg, resample) in zip(layers, ops):
                if op in device_ops.GEOMETRIC:
                    assert params == fast._affine_matrix(op, arg, 224)
                    assert op_kind == fast._interpolation_code(resample)
                elif arg is not None:
                    assert params[0] == arg


def test_over_many_draws_each_op_layer_and_flip_comes_as_often_as_the_policy_says(transform):
    """rand-m9-mstd0.5-inc1 over 4,000 images: 2 layers, each op 1 in 15 of them and applied with probability 0.5,
    the flip half the time, levels drawn from N(9, 0.5) clipped at 10 (so a rotation's angle is 27 degrees on
    average, either sign), each within five standard errors; crop areas between 0.08 and 1 of the image."""
    draws = fast.Draws(transform)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    n = 4000
    codes, flips, angles, areas = Counter(), 0, [], []
    for _ in range(n):
        (top, left, h, w), _, flip, plan = draws(500, 375)
        flips += flip
        areas.append(h * w / (500 * 375))
        for code, params in zip(plan.codes, plan.params):
            codes[code] += 1
            if code != fast.SKIPPED and fast.OPS[code] == "rotate":
                angles.append(math.degrees(math.atan2(params[1], params[0])))

    def near(count, total, p):
        return abs(count - total * p) <= 5 * math.sqrt(total * p * (1 - p))

    layers = 2 * n
    assert near(codes[fast.SKIPPED], layers, 0.5) and near(flips, n, 0.5)
    ops = {code: count for code, count in codes.items() if code != fast.SKIPPED}
    assert len(ops) == 15 and all(near(count, layers, 0.5 / 15) for count in ops.values())
    assert abs(np.mean(np.abs(angles)) - 27) < 0.5 and near(sum(a > 0 for a in angles), len(angles), 0.5)
    assert 0.08 <= min(areas) < 0.1 and 0.9 < max(areas) <= 1


def test_a_whole_images_augmentation_is_the_pil_paths_drawn_with_the_same_seeds(photos, transform):
    """Crop, resize, flip and RandAugment of each photograph, the fast path against timm's PIL transform under the
    same seeds: at most 0.2% of an image's pixels differ (a resize's one-level difference, carried through)."""
    head = type(transform)(transform.transforms[:3])  # RandomResizedCrop, flip, RandAugment: the uint8 part
    crops = fast.CropSet(photos, "train", fast.Draws(transform))
    augment = fast.DeviceAugment(crops.draws, torch.device("cpu"))
    for i in range(24):
        path = crops.samples[i % len(crops)][0].file
        random.seed(i), np.random.seed(i), torch.manual_seed(i)
        expected = as_batch([head(Image.open(path).convert("RGB"))])
        random.seed(i), np.random.seed(i), torch.manual_seed(i)
        batch, _ = crops.collate([crops[i % len(crops)]])
        assert differing(augment(batch), expected)[1] <= 0.002


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    """ImageNet's odd files in a prepared layout: CMYK and grayscale JPEGs, a PNG named .JPEG, a progressive and a
    4:4:4 JPEG, beside an ordinary one."""
    root = tmp_path_factory.mktemp("odd")
    photo = Image.open(photographs()[2]).convert("RGB").resize((400, 342))
    (root / "train" / "n0").mkdir(parents=True)
    files = {
        "ordinary.JPEG": lambda p: photo.save(p, "JPEG", quality=90),
        "cmyk.JPEG": lambda p: photo.convert("CMYK").save(p, "JPEG", quality=90),
        "gray.JPEG": lambda p: photo.convert("L").save(p, "JPEG", quality=90),
        "png.JPEG": lambda p: photo.save(p, "PNG"),
        "progressive.JPEG": lambda p: photo.save(p, "JPEG", quality=90, progressive=True),
        "444.JPEG": lambda p: photo.save(p, "JPEG", quality=95, subsampling=0),
    }
    for name, save in files.items():
        save(root / "train" / "n0" / name)
    write_manifest(root, whole_files(root, [("train", f"train/n0/{name}", 0) for name in files]))
    (root / "classes.json").write_text('[{"index": 0, "wnid": "n0", "name": "odd"}]')
    return root


def test_imagenets_odd_files_decode_to_pillows_pixels(odd_files, transform):
    crops = fast.CropSet(odd_files, "train", fast.Draws(transform))
    for image, _ in crops.samples:
        assert np.array_equal(decode_full(image), np.asarray(Image.open(image.file).convert("RGB"))), image.name
    batch, labels = crops.collate([crops[i] for i in range(len(crops))])
    assert fast.DeviceAugment(crops.draws, torch.device("cpu"))(batch).shape == (len(crops), 3, 224, 224)


def one_class(root: Path, files: dict) -> Path:
    """A prepared layout of one class holding ``files`` (name: bytes), in that order."""
    (root / "train" / "n0").mkdir(parents=True)
    for name, data in files.items():
        (root / "train" / "n0" / name).write_bytes(data)
    write_manifest(root, whole_files(root, [("train", f"train/n0/{name}", 0) for name in files]))
    (root / "classes.json").write_text('[{"index": 0, "wnid": "n0", "name": "n0"}]')
    return root


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_file_is_refused_in_the_pil_paths_one_sentence(odd_files, transform, tmp_path, damage):
    """The same sentence, word for word, as the PIL path gives for the same file: it names the file and the fix."""
    data = (odd_files / "train" / "n0" / "ordinary.JPEG").read_bytes()
    data = {"truncated": data[: len(data) // 2], "garbage": b"\xff\xd8" + bytes(range(256)) * 8, "empty": b""}[damage]
    root = one_class(tmp_path / "cls", {"bad.JPEG": data})
    with pytest.raises(UnreadableImage) as pil:
        ManifestDataset(root, "train", transform)[0]
    crops = fast.CropSet(root, "train", fast.Draws(transform))
    for fetch in (lambda: crops[0], lambda: crops.__getitems__([0])):  # one image, and a batch as workers fetch it
        with pytest.raises(UnreadableImage) as ours:
            fetch()
        assert str(ours.value) == str(pil.value) and str(root / "train" / "n0" / "bad.JPEG") in str(ours.value)


@pytest.mark.parametrize("side", [13000, 20000], ids=["below-twice-the-limit", "over-twice-the-limit"])
def test_an_image_over_pillows_pixel_limit_is_refused_from_its_header_on_every_input_path(
    tmp_path, recipe, transform, monkeypatch, side
):
    """A 2 MB JPEG declaring 13000 x 13000 pixels (what preparation counts unreadable, met in a layout prepared before
    it did): the PIL path, the fast path (one image, and a batch as a worker fetches it) and the bench's decode-only
    path refuse it from its header, before a pixel is decoded, in one sentence naming the file and the fix. Over twice
    the limit the PIL path's sentence lacks the size, which Pillow refuses before telling it."""
    root = one_class(tmp_path / "cls", {"big.JPEG": flat_jpeg(side, side)})

    def decoded(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(simplejpeg, "decode_jpeg", decoded)
    monkeypatch.setattr(ImageFile.ImageFile, "load", decoded)
    limit = "over Pillow's limit of 89,478,485 pixels (PIL.Image.MAX_IMAGE_PIXELS)"
    fix = (
        ", so it is not decoded; re-run prepare_cls (`dvc repro -f -s prepare_cls`), which counts it unreadable and "
        "leaves it out, then `dvc repro`."
    )
    named = f"the prepared image {root / 'train' / 'n0' / 'big.JPEG'} is"
    crops = fast.CropSet(root, "train", fast.Draws(transform))
    for path, fetch in {
        "pil": lambda: ManifestDataset(root, "train", transform)[0],
        "fast": lambda: crops[0],
        "fast batch": lambda: crops.__getitems__([0]),
        "decode only": lambda: path_step(root, recipe, "decode")(0),
    }.items():
        with pytest.raises(UnreadableImage) as refused:
            fetch()
        sized = not (path == "pil" and side == 20000)
        assert str(refused.value) == f"{named} {side}x{side} pixels, {limit}{fix}" if sized else f"{named} {limit}{fix}"


def restart_marker_jpeg(photo: Image.Image) -> bytes:
    """A JPEG whose header libjpeg-turbo reads but whose data it refuses (three bytes before a restart marker),
    which Pillow decodes: the fast path decodes it through Pillow, at full scale."""
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=90, restart_marker_rows=1)
    data = buf.getvalue()
    marker = data.index(b"\xff\xd0", data.index(b"\xff\xda"))
    return data[:marker] + b"\0\0\0" + data[marker:]


def test_a_batch_buffer_is_sized_for_its_crops_as_decoded_not_for_their_boxes(tmp_path, transform, monkeypatch):
    """Crops of a 3200 x 2400 photograph decode at 1/2 to 1/8 scale, and the batch's buffer is exactly those crops,
    not their boxes at full size. A file libjpeg-turbo refuses after its header decodes through Pillow at full size,
    more than was planned: the buffer grows once, and the batch is still the one fetched image by image."""
    photo = Image.open(photographs()[0]).convert("RGB").resize((3200, 2400), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=90)
    root = one_class(tmp_path / "cls", {"large.JPEG": buf.getvalue(), "refused.JPEG": restart_marker_jpeg(photo)})
    asked = []
    allocate = fast._bytes_for_a_batch
    monkeypatch.setattr(fast, "_bytes_for_a_batch", lambda count: asked.append(count) or allocate(count))
    crops = fast.CropSet(root, "train", fast.Draws(transform))

    fetched = crops.__getitems__([0] * 8)
    assert asked == [fetched.pixels.numel()]
    assert all(h * w * 4 <= 3200 * 2400 for h, w in fetched.shapes)  # each a quarter of the photograph or less
    for seed, indices in enumerate([[1, 0], [0, 1]]):
        asked.clear()
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        fetched = crops.__getitems__(indices)
        assert len(asked) == 2 and asked[-1] == fetched.pixels.numel()  # planned, then grown to fit
        batch, _ = crops.collate(fetched)
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        one_by_one, _ = crops.collate([crops[i] for i in indices])
        assert torch.equal(batch.pixels, one_by_one.pixels) and torch.equal(batch.sizes, one_by_one.sizes)


@pytest.mark.parametrize("fault", [None, "killed", "no-room"])
def test_a_batch_crosses_from_its_worker_in_shared_memory_that_a_dying_worker_cannot_leave_behind(
    photos, transform, tmp_path, monkeypatch, fault
):
    """A batch's buffer is shared memory with no name in /dev/shm: the batch arrives whole, as fetched in the loading
    process with the same seeds; a worker killed while it holds one, or refused the room for it (a file size limit
    stands in for a full /dev/shm), leaves no torch_* or psm_* file behind."""
    crops = fast.CropSet(photos, "train", fast.Draws(transform))
    worker = tmp_path / "worker_pid"
    if fault == "killed":  # decoded after the buffer was allocated
        monkeypatch.setattr(fast, "decode_box", lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL))

    def start(_):
        worker.write_text(str(os.getpid()))
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        if fault == "no-room":  # smaller than any batch of four crops
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    before = set(os.listdir("/dev/shm"))
    loader = DataLoader(
        crops,
        batch_size=4,
        num_workers=1,
        collate_fn=crops.collate,
        worker_init_fn=start,
        multiprocessing_context="fork",
    )
    if fault is None:
        batch, labels = next(iter(loader))
        random.seed(0), np.random.seed(0), torch.manual_seed(0)
        here, _ = crops.collate(crops.__getitems__([0, 1, 2, 3]))
        assert batch.pixels.is_shared() and labels.tolist() == [0] * 4
        assert torch.equal(batch.pixels, here.pixels) and torch.equal(batch.sizes, here.sizes)
    else:
        with pytest.raises((OSError, RuntimeError)):  # the allocation's error, or "worker ... exited unexpectedly"
            next(iter(loader))
    pid = worker.read_text()
    left = [name for name in set(os.listdir("/dev/shm")) - before if name.startswith((f"torch_{pid}_", "psm_"))]
    assert left == []


def test_the_loader_bench_leaves_out_a_folders_image_over_the_pixel_limit(tmp_path, photos):
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(2):
        (folder / f"{i}.JPEG").write_bytes((photos / "train" / "n0" / f"{i}.JPEG").read_bytes())
    (folder / "big.JPEG").write_bytes(flat_jpeg(13000, 13000))
    (tmp_path / "scratch").mkdir()
    data = as_prepared(folder, tmp_path / "scratch", limit=10)
    assert [image.name for image, _ in read_manifest(data, "train")] == ["0.JPEG", "1.JPEG"]


@pytest.mark.parametrize(
    "change, names",
    [
        ({"auto_augment": "none", "color_jitter": 0.4}, "ColorJitter"),
        ({"train_interpolation": "nearest"}, "nearest"),
        ({"auto_augment": "augmix-m5"}, "AugMixAugment"),
        ({"auto_augment": "rand-m9-t3a", "color_jitter": 0.0}, "RandAugment's (Desaturate|GaussianBlur)"),
    ],
)
def test_what_the_fast_path_does_not_implement_is_refused_in_one_sentence(recipe, change, names):
    with pytest.raises(BadInput, match=f"{names}.*; set input_path: pil"):
        fast.Draws(build_transforms(recipe.model_copy(update=change), training=True))


def test_a_batch_travels_as_uint8_crops_with_a_schedule_the_device_never_reads_back(photos, transform):
    """The worker ships uint8 crops and the draws, and works out on the host what the device side will do: the resize
    chunks (each crop in one, of one pass order) and, per RandAugment layer, the images each op takes (each image
    once per layer, in no group where the layer applied nothing). A batch fetched whole (each crop copied straight
    into it) is the batch fetched image by image. The draws pickle, so spawned workers get them."""
    import pickle

    crops = fast.CropSet(photos, "train", fast.Draws(transform))
    pickle.loads(pickle.dumps(crops)).draws(500, 375)  # what a spawned worker receives, and uses
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    batch, labels = crops.collate(crops.__getitems__(list(range(12))))  # as a loader worker fetches a batch
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    one_by_one, _ = crops.collate([crops[i] for i in range(12)])  # the same draws, each crop copied twice
    for field, value in zip(batch._fields, batch):
        assert (
            torch.equal(value, getattr(one_by_one, field))
            if torch.is_tensor(value)
            else value == getattr(one_by_one, field)
        ), field
    assert batch.pixels.dtype == torch.uint8 and batch.pixels.numel() == int((batch.sizes.prod(1) * 3).sum())
    assert labels.tolist() == [0] * 12 and batch.params.shape == (12, 2, 6)
    order = batch.order.tolist()
    assert (
        sorted(order[:12]) == list(range(12))
        and [c[0] for c in batch.chunks] == [0, *(c[1] for c in batch.chunks)][:-1]
    )
    assert batch.chunks[-1][1] == 12
    for first, last, height, width, tall in batch.chunks:  # every crop of a chunk fits its padded size
        for i in order[first:last]:
            rows, cols = batch.sizes[i].tolist()[:: -1 if tall else 1]
            assert rows <= height and cols <= width
    for layer in range(2):
        taken = [i for lay, _, first, last, *_ in batch.groups if lay == layer for i in order[12 + first : 12 + last]]
        assert len(taken) == len(set(taken)) <= 12
    images = fast.DeviceAugment(crops.draws, torch.device("cpu"))(batch)
    assert images.shape == (12, 3, 224, 224) and torch.equal(images, images.round()) and 0 <= images.min()
    assert images.max() <= 255
