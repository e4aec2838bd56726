"""``model.caption`` streams: every input is checked first (types, shapes, files and their headers), then
the pictures are decoded and captioned one batch at a time, in order, so the decoded pictures held at
once are one batch's whatever the number of images; any iterable is taken, read once."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from PIL import Image
from tool_runs import REPO

import captioning
import captioning.data.images as images_module
import captioning.inference.captioner as captioner_module
from captioning.api import Caption, CaptioningModel
from captioning.data.images import ImageError

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def model() -> CaptioningModel:
    return captioning.load(FIXTURE, device="cpu")


def _photo(path: Path, seed: int, size: int = 1500) -> Path:
    """A ``size`` x ``size`` picture of 30 x 30 random blocks (each seed its own; quick to write)."""
    blocks = np.random.default_rng(seed).integers(0, 256, (30, 30, 3), dtype=np.uint8)
    Image.fromarray(blocks).resize((size, size), Image.Resampling.NEAREST).save(path)
    return path


class DecodedPictures:
    """Counts the decoded RGB pictures alive at once: every picture ``load_image`` and ``as_rgb_image``
    return comes out of ``to_rgb``, whose outputs are followed until they are freed."""

    def __init__(self) -> None:
        self.made = 0
        self.alive = 0
        self.peak = 0

    def spy(self, to_rgb):
        def counted(image: Image.Image) -> Image.Image:
            picture = to_rgb(image)
            self.made += 1
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            weakref.finalize(picture, self._freed)
            return picture

        return counted

    def _freed(self) -> None:
        self.alive -= 1


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> DecodedPictures:
    pictures = DecodedPictures()
    monkeypatch.setattr(images_module, "to_rgb", pictures.spy(images_module.to_rgb))
    return pictures


def _same(caption: Caption, alone: Caption) -> None:
    assert caption.words == alone.words
    assert caption.log_prob == pytest.approx(alone.log_prob, abs=1e-4)
    np.testing.assert_allclose(caption.attention, alone.attention, atol=1e-5)


def test_decoded_pictures_in_memory_are_one_batch(model, decoded, tmp_path):
    # 24 pictures of 400 x 400 in batches of 4: six batches, as many decoded at once as one or two hold
    paths = [_photo(tmp_path / f"photo{k:02d}.{'jpg' if k % 2 else 'png'}", k, size=400) for k in range(24)]
    captions = model.caption(paths, batch_size=4)
    assert len(captions) == 24
    assert decoded.made == 24  # each image decoded once
    assert decoded.peak <= 2 * 4, f"{decoded.peak} decoded pictures alive at once, for batches of 4"
    assert decoded.alive == 0  # none kept once the captions are made


def test_a_mixed_list_is_captioned_in_order_as_each_image_alone(model, tmp_path):
    paths = [_photo(tmp_path / f"photo{k}.png", k, size=120) for k in range(4)]
    pixels = [np.array(Image.open(path).convert("RGB")) for path in paths]  # (H, W, 3) uint8
    mixed = [
        paths[0],
        str(paths[1]),
        Image.open(paths[2]),
        pixels[3],
        torch.from_numpy(pixels[0]).permute(2, 0, 1),
        pixels[1] / 255.0,
        _photo(tmp_path / "other.jpg", 9, size=200),
    ]
    captions = model.caption(mixed, batch_size=3)  # batches of 3, 3 and 1
    assert len(captions) == len(mixed)
    for image, caption in zip(mixed, captions, strict=True):
        (alone,) = model.caption([image])
        _same(caption, alone)
    for first, again in ((0, 4), (1, 5)):  # the same picture as a file and in memory
        _same(captions[again], captions[first])
    assert len({round(caption.log_prob, 3) for caption in captions[:4]}) == 4  # a mix-up would show


@pytest.mark.parametrize("bad", ["header bomb", "truncated header", "missing", "float range"])
def test_a_bad_image_late_in_the_list_is_refused_before_any_work(model, tmp_path, monkeypatch, bad):
    images: list = [_photo(tmp_path / f"photo{k:02d}.png", k, size=64) for k in range(60)]
    target = tmp_path / "bad.png"
    if bad == "header bomb":  # a 109-byte PNG of 30,001 x 8 one-bit pixels
        Image.new("1", (30_001, 8)).save(target)
    elif bad == "truncated header":
        target = tmp_path / "bad.jpg"
        target.write_bytes(_photo(tmp_path / "whole.jpg", 1).read_bytes()[:200])
    elif bad == "float range":
        target = np.full((8, 8, 3), 1.5)  # type: ignore[assignment]
    images[50] = target
    calls = []
    monkeypatch.setattr(images_module, "to_rgb", lambda image: calls.append("decoded"))
    monkeypatch.setattr(captioner_module, "generate_captions", lambda *args, **kw: calls.append("captioned"))
    with pytest.raises(ImageError, match=r"images\[50\]"):
        model.caption(images, batch_size=4)
    assert calls == []  # no picture decoded, no caption computed


def test_a_file_damaged_after_its_header_is_named_when_its_batch_is_decoded(model, tmp_path):
    paths = [_photo(tmp_path / f"photo{k}.jpg", k, size=300) for k in range(8)]
    whole = paths[6].read_bytes()
    paths[6].write_bytes(whole[: len(whole) // 2])  # the header is whole, the pixels are cut
    with raises_naming(ImageError, f"{paths[6]} (images[6])", "decode"):
        model.caption(paths, batch_size=4)


def test_a_generator_is_read_once(model, tmp_path):
    paths = [_photo(tmp_path / f"photo{k}.png", k, size=80) for k in range(5)]
    read = []

    def generated() -> Iterator[Path]:
        for path in paths:
            read.append(path)
            yield path

    captions = model.caption(generated(), batch_size=2)
    assert read == paths  # each item read once, in order
    for caption, expected in zip(captions, model.caption(paths), strict=True):
        _same(caption, expected)
    bad = iter([*paths, tmp_path / "missing.png"])
    with raises_naming(ImageError, f"{tmp_path / 'missing.png'} (images[5])", "not found"):
        model.caption(bad)
    assert next(bad, None) is None
    assert model.caption(iter([])) == []
