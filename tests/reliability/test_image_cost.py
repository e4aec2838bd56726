"""Images are refused by what they would cost, from their header, before any pixel is decoded.

A 1 x 80,000,000 one-bit PNG is 155 KB and under Pillow's 89M-pixel guard, but decodes to 80 MB and
its resize to the encoder's size needs tens of GB. The real files go through the real tools in a
subprocess whose address space is capped at 4 GB: a decode or a resize would die of MemoryError there.
"""

from __future__ import annotations

import json
import re
import resource
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tool_runs import ONE_THREAD, REPO

from captioning.config.loading import load_config
from captioning.data.images import ImageError, as_rgb_image, load_image
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import save_checkpoint
from captioning.models.captioner import Captioner

MEMORY_LIMIT = 4 << 30  # bytes of address space: enough for torch and a tiny model, not for the bombs


def one_bit_png(width: int, height: int) -> bytes:
    """A real, fully valid black PNG of ``width`` x ``height`` one-bit pixels, compressed as it streams."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" + b"\0" * ((width + 7) // 8)  # filter byte, then the packed bits
    compressor = zlib.compressobj(9)
    rows_per_piece = max(1, (1 << 20) // len(row))
    pieces = []
    for start in range(0, height, rows_per_piece):
        pieces.append(compressor.compress(row * min(rows_per_piece, height - start)))
    pieces.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # bit depth 1, grayscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(pieces)) + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bombs")
    files = {"tall.png": one_bit_png(1, 80_000_000), "wide.png": one_bit_png(80_000_000, 1)}
    paths = {}
    for name, content in files.items():
        (folder / name).write_bytes(content)
        paths[name] = folder / name
    return paths


def test_the_bombs_are_real_and_under_pillows_own_guard(bombs):
    assert (bombs["tall.png"].stat().st_size < 200_000) and (bombs["wide.png"].stat().st_size < 20_000)
    for path in bombs.values():
        with Image.open(path) as image:
            assert image.width * image.height == 80_000_000 < Image.MAX_IMAGE_PIXELS
            assert image.mode == "1"


@pytest.mark.parametrize("name", ["tall.png", "wide.png"])
def test_load_image_refuses_by_the_header_naming_the_file(bombs, name, monkeypatch):
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self) or None)  # no pixel read
    with pytest.raises(
        ImageError, match=rf"^{bombs[name]} \(image 7\): image too large \((1x80000000|80000000x1) pixels"
    ):
        load_image(bombs[name], "image 7")
    assert not decoded


@pytest.mark.parametrize(
    ("size", "reason"),
    [((30_001, 100), "each side may be at most 30000"), ((20_000, 200), "aspect ratio over 50:1")],
)
def test_pictures_in_memory_are_refused_before_they_are_resized(size, reason):
    lazy = Image.new("1", size)
    with pytest.raises(ImageError, match=rf"images\[3\]: .*{reason}"):
        as_rgb_image(lazy, "images[3]")
    width, height = size
    with pytest.raises(ImageError, match=reason):
        as_rgb_image(np.zeros((height, width), np.uint8), "images[3]")


def test_shapes_cameras_make_still_load(tmp_path):
    for size in [(12_000, 1_500), (1, 1), (64, 1), (6_000, 4_000)]:
        Image.new("RGB", size, (10, 200, 30)).save(tmp_path / "photo.png")
        assert load_image(tmp_path / "photo.png").size == size


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("run")
    config = load_config(
        REPO / "configs" / "shapes.yaml",
        {
            "model.encoder.weights": "none",
            "model.encoder.image_size": 64,
            "model.decoder.embed_dim": 8,
            "model.decoder.hidden_dim": 16,
            "model.decoder.attention_dim": 8,
        },
    )
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "red", "square"])
    model = Captioner.build(config.model, vocab)
    path = run / "best.pt"
    save_checkpoint(
        path,
        config=config,
        vocab=vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_state=model.encoder.state_dict(),  # random weights (weights=none): kept with the model
        encoder_fingerprint=model.encoder.fingerprint(),
    )
    return path


def capped(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``command`` in a subprocess whose address space is capped at MEMORY_LIMIT."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
        preexec_fn=cap,
        check=False,
    )


@pytest.mark.slow
def test_evaluate_images_skips_and_counts_the_bombs_under_a_memory_limit(bombs, checkpoint, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, path in bombs.items():
        (folder / name).write_bytes(path.read_bytes())
    for k in range(3):
        Image.new("RGB", (80, 60), (40 * k, 90, 200)).save(folder / f"photo{k}.jpg")
    results = tmp_path / "captions.json"
    command = [sys.executable, str(REPO / "evaluate.py"), "--checkpoint", str(checkpoint)]
    command += ["--images", str(folder), "--results", str(results), "--skip-bad-images", "--no-progress"]
    result = capped(command, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipped 2 of 5 images that could not be read" in result.stdout
    assert "MemoryError" not in result.stderr
    for name in bombs:
        assert f"{folder / name}" in result.stderr and "image too large" in result.stderr
    assert len(json.loads(results.read_text())) == 3

    # without --skip-bad-images: one line naming the first bomb, before any captioning
    refused = capped(command[:-2] + ["--no-progress"], tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(folder) in last and "image too large" in last
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_the_python_api_names_the_bomb_under_a_memory_limit(bombs, checkpoint, tmp_path):
    script = (
        "import sys, captioning\n"
        "model = captioning.load(sys.argv[1])\n"
        "for path in sys.argv[2:]:\n"
        "    try:\n"
        "        model.caption([path])\n"
        "    except captioning.api.ImageError as error:\n"
        "        print('refused:', error)\n"
    )
    result = capped([sys.executable, "-c", script, str(checkpoint), *map(str, bombs.values())], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line, path in zip(lines, bombs.values(), strict=True):
        assert line.startswith(f"refused: {path}") and "each side may be at most" in line
    assert torch.__version__  # the subprocess imported the same torch


@pytest.mark.parametrize(
    ("picture", "outcome"),
    [
        (torch.rand(3, 8, 8).bfloat16(), "RGB"),
        (torch.rand(3, 8, 8).half(), "RGB"),
        (Image.new("La", (8, 8), (100, 255)), "RGB"),
        (Image.new("RGBa", (8, 8)), "RGB"),
        (torch.empty(3, 8, 8, device="meta"), "needs dense values, got a tensor on the meta device"),
        (torch.rand(3, 8, 8).to_sparse(), "needs dense values, got a tensor with layout torch.sparse_coo"),
        (Image.new("RGB", (0, 0)), "an image needs a size of at least 1x1, got 0x0"),
    ],
)
def test_pictures_of_every_kind_convert_or_are_refused_in_one_line(picture, outcome):
    if outcome == "RGB":
        assert as_rgb_image(picture, "images[0]").mode == "RGB"
    else:
        with pytest.raises(ImageError, match=rf"^images\[0\]: .*{re.escape(outcome)}"):
            as_rgb_image(picture, "images[0]")
