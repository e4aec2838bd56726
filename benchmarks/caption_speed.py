"""The captioning part of ``speed.py`` (``--parts caption``): a folder of JPEG photos captioned end to end.

Ours: ``captioning.load(checkpoint).caption(paths, beam_size=3)`` over ``images`` JPEG files of
``photo_size`` pixels that the part writes into a temporary folder: every file's header checked,
the pictures decoded and resized batch by batch (``decode.batch_size``, 50), the encoder
(ResNet-101 at ``image_size`` px, ``model.encoder.weights=none``: random weights, offline), the
batched beam search and the attention maps in the returned ``Caption`` objects. The checkpoint is
written by the part itself with the project's ``save_checkpoint``: the reference decoder
(vocabulary 9490), its ``<end>`` made unreachable (output bias -1e4, as the beam part does) so that
every search runs ``max_length`` words, the same work for every image.

The tutorial: ``tutorial_baseline.caption_image_beam_search``, one file at a time (read with PIL,
resized to 256 px, the tutorial's ResNet-101 encoder with random weights and its grid pooled to
14 x 14, the one-image beam search of the same decoder weights, ``max_length`` steps), on the first
``tutorial_images`` files: its rate is per image.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import PeakMemory, median_seconds
from PIL import Image
from scst_speed import vocabulary
from tutorial_baseline import TutorialDecoder, TutorialEncoder, caption_image_beam_search

import captioning
from captioning.config import Config, DecodeConfig, EncoderConfig, LSTMDecoderConfig, ModelConfig
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import save_checkpoint
from captioning.models.captioner import Captioner


@dataclass(frozen=True)
class CaptionSizes:
    """The captioning part's sizes; the defaults are the reference."""

    images: int = 64
    photo_width: int = 640
    photo_height: int = 480
    encoder: str = "resnet101"
    image_size: int = 224  # ours: 7 x 7 x 2048 at 224 px (the native grid)
    beam_size: int = 3
    max_length: int = 20  # decode.max_length's default
    tutorial_images: int = 8  # the tutorial captions one file at a time: its rate is per image
    tutorial_image_size: int = 256
    tutorial_grid: int = 14


QUICK = CaptionSizes(
    images=2,
    photo_width=64,
    photo_height=48,
    image_size=32,
    max_length=3,
    tutorial_images=1,
    tutorial_image_size=32,
    tutorial_grid=2,
)


def write_photos(folder: Path, sizes: CaptionSizes) -> list[Path]:
    """``images`` JPEG files (quality 90) of smooth random colour fields with some grain: photo-like
    content, so the files have a photo's size and decoding cost (random noise would not compress)."""
    rng = np.random.default_rng(0)
    paths = []
    for number in range(sizes.images):
        coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        field = Image.fromarray(coarse).resize(
            (sizes.photo_width, sizes.photo_height), Image.Resampling.BICUBIC
        )
        grain = rng.normal(0, 6, (sizes.photo_height, sizes.photo_width, 3))
        pixels = np.clip(np.asarray(field, dtype=np.float64) + grain, 0, 255).astype(np.uint8)
        path = folder / f"photo_{number:03d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def write_checkpoint(
    path: Path, sizes: CaptionSizes, decoder_config: LSTMDecoderConfig, vocab_size: int
) -> Captioner:
    """A checkpoint of an untrained captioner (``sizes.encoder`` with random weights, saved with it);
    returns the model it holds."""
    torch.manual_seed(0)
    model_config = ModelConfig(
        encoder=EncoderConfig(name=sizes.encoder, weights="none", image_size=sizes.image_size, grid_size=0),
        decoder=decoder_config,
    )
    vocab = vocabulary(vocab_size)
    model = Captioner.build(model_config, vocab)
    with torch.no_grad():
        model.decoder.out.bias[Vocabulary.end_id] = -1e4
    config = Config(
        model=model_config,
        decode=DecodeConfig(strategy="beam", beam_size=sizes.beam_size, max_length=sizes.max_length),
    )
    save_checkpoint(
        path,
        config=config,
        vocab=vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_state=model.encoder.state_dict(),
        encoder_fingerprint=model.encoder.fingerprint(),
    )
    return model


def ours(
    checkpoint: Path, paths: list[Path], sizes: CaptionSizes, device: torch.device, repeats: int
) -> dict:
    """``captioning.load(checkpoint).caption(paths, beam_size=...)``: load time, images/s, memory."""
    start = time.perf_counter()
    model = captioning.load(checkpoint, device=str(device))
    results: dict[str, Any] = {"caption_load_s": time.perf_counter() - start}
    captions: list = []

    def run() -> None:
        captions[:] = model.caption(paths, beam_size=sizes.beam_size)

    with PeakMemory(device) as memory:
        seconds = median_seconds(run, repeats, device)
    if len(captions) != len(paths) or any(len(c.words) != sizes.max_length for c in captions):
        raise RuntimeError("caption() did not return one full-length caption per image")
    grid = model.grid
    if any(c.attention.shape != (sizes.max_length, *grid) for c in captions):
        raise RuntimeError("caption() did not return one attention map per word")
    results["caption_images_per_s"] = len(paths) / seconds
    results["caption_peak_rss_mb"] = memory.peak_mib
    results["caption_peak_mem_mb"] = memory.mib
    results["caption_grid"] = f"{grid[0]}x{grid[1]}"
    return results


def tutorial(
    decoder: TutorialDecoder, paths: list[Path], sizes: CaptionSizes, device: torch.device, repeats: int
) -> dict:
    """The tutorial's ``caption_image_beam_search`` over ``tutorial_images`` files, one at a time."""
    torch.manual_seed(0)
    encoder = TutorialEncoder(sizes.tutorial_grid, sizes.encoder).to(device).eval()
    few = paths[: sizes.tutorial_images]

    def run() -> None:
        for path in few:
            caption_image_beam_search(
                encoder,
                decoder,
                path,
                sizes.beam_size,
                Vocabulary.start_id,
                Vocabulary.end_id,
                sizes.max_length,
                sizes.tutorial_image_size,
            )

    with PeakMemory(device) as memory:
        seconds = median_seconds(run, repeats, device)
    return {
        "tutorial_caption_images_per_s": len(few) / seconds,
        "tutorial_caption_peak_rss_mb": memory.peak_mib,
        "tutorial_caption_peak_mem_mb": memory.mib,
    }


def measure(
    sizes: CaptionSizes,
    decoder_config: LSTMDecoderConfig,
    vocab_size: int,
    device: torch.device,
    repeats: int,
    tutorial_repeats: int,
) -> dict[str, Any]:
    """Images per second and peak memory of ``caption()`` over the folder and of the tutorial's path
    (each side's model is freed before the other's is measured)."""
    with tempfile.TemporaryDirectory(prefix="speed_caption_") as folder:
        paths = write_photos(Path(folder), sizes)
        checkpoint = Path(folder) / "model.pt"
        decoder = write_checkpoint(checkpoint, sizes, decoder_config, vocab_size).decoder
        tutorial_decoder = TutorialDecoder.from_ours(decoder).to(device).eval()
        del decoder
        results = ours(checkpoint, paths, sizes, device, repeats)
        results.update(tutorial(tutorial_decoder, paths, sizes, device, tutorial_repeats))
    results["speedup_caption"] = results["caption_images_per_s"] / results["tutorial_caption_images_per_s"]
    return results
