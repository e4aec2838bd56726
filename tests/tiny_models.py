"""Tiny real checkpoints for the tests of the Python API, model folders and the demo.

``tiny_checkpoint(path, shapes_root, vocab, kind="lstm", encoder_weights="none")`` writes what
``train.py`` writes (configuration, vocabulary, decoder weights, the encoder's when they cannot be
rebuilt from their name, the encoder fingerprint) for a seeded, untrained captioner of 64 px images:
captions of 3 to 5 words, each with an attention map, in well under a second (the same caption for
every image: for errors, shapes and layouts).

``trained_checkpoint(folder)`` trains a real tiny run with ``train.py``'s code (Shapes at 64 px, the
pretrained efficientnet_lite0, 12 short epochs) whose captions differ from image to image, and
returns ``(best.pt, the test split's image files)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from tool_runs import REPO, kept_process_state

from captioning.config import DECODERS as DECODER_FAMILIES
from captioning.config import (
    Config,
    DecodeConfig,
    DecoderConfig,
    EncoderConfig,
    LSTMDecoderConfig,
    ModelConfig,
    ShapesDataConfig,
    TransformerDecoderConfig,
)
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import save_checkpoint
from captioning.models.captioner import Captioner

DECODERS = {
    "lstm": LSTMDecoderConfig(embed_dim=16, hidden_dim=16, attention_dim=16),
    "transformer": TransformerDecoderConfig(
        d_model=16, num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=2
    ),
}


TINY_WIDTH, TINY_DEPTH = 16, 2


def tiny_decoder_config(kind: str, **options) -> DecoderConfig:
    """The options of the registered decoder family ``kind`` at its defaults, with every size shrunk:
    an integer field that names a width (``*_dim``, ``d_*``) at most ``TINY_WIDTH``, one that names a
    depth (``*_layers``) at most ``TINY_DEPTH``; ``options`` set as given."""
    config_class = DECODER_FAMILIES[kind].config
    shrunk = {}
    for field in dataclasses.fields(config_class):
        default = field.default
        if not isinstance(default, int) or isinstance(default, bool):
            continue
        if field.name.endswith("_dim") or field.name.startswith("d_"):
            shrunk[field.name] = min(default, TINY_WIDTH)
        elif field.name.endswith("_layers"):
            shrunk[field.name] = min(default, TINY_DEPTH)
    return config_class(**{**shrunk, **options})


def tiny_checkpoint(
    path: Path,
    shapes_root: Path,
    vocab: Vocabulary,
    kind: str = "lstm",
    encoder_weights: str = "none",
    seed: int = 0,
    decoder: DecoderConfig | None = None,
) -> Path:
    """A seeded untrained captioner on the tiny Shapes data, saved as ``train.py`` saves one (its decoder
    ``decoder``, by default ``DECODERS[kind]``)."""
    generator_state = torch.get_rng_state()
    torch.manual_seed(seed)
    model_config = ModelConfig(
        encoder=EncoderConfig(name="efficientnet_lite0", weights=encoder_weights, image_size=64, grid_size=0),
        decoder=decoder or DECODERS[kind],
    )
    model = Captioner.build(model_config, vocab)
    torch.set_rng_state(generator_state)
    data = ShapesDataConfig(
        root=str(shapes_root),
        shapes_train=12,
        shapes_val=4,
        shapes_test=4,
        shapes_image_size=64,
    )
    config = Config(
        data=data,
        model=model_config,
        decode=DecodeConfig(strategy="beam", beam_size=2, min_length=3, max_length=5),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(
        path,
        config=config,
        vocab=vocab,
        decoder_state=model.decoder.state_dict(),
        encoder_state=model.encoder.state_dict() if encoder_weights == "none" else None,
        encoder_fingerprint=model.encoder.fingerprint(),
    )
    return path


def photo(path: Path, size: tuple[int, int] = (96, 64)) -> Path:
    """scikit-image's cat (chelsea), scaled down: a real photograph of odd size."""
    from skimage import data

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(data.chelsea()).resize(size, Image.Resampling.BICUBIC).save(path)
    return path


def pattern(path: Path, seed: int, size: tuple[int, int] = (50, 70)) -> Path:
    """A random-noise picture (each seed its own), PNG."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def trained_checkpoint(folder: Path) -> tuple[Path, list[Path]]:
    """A tiny trained run in ``folder/run`` on Shapes generated in ``folder/shapes``: its best.pt and
    the test images (captions that differ between images, e.g. ``a large purple triangle``)."""
    from captioning.config.loading import load_config
    from captioning.training.run import train

    values = {
        "data.root": str(folder / "shapes"),
        "data.shapes_train": 32,
        "data.shapes_val": 8,
        "data.shapes_test": 8,
        "data.shapes_image_size": 64,
        "model.encoder.image_size": 64,
        "model.decoder.embed_dim": 16,
        "model.decoder.hidden_dim": 32,
        "model.decoder.attention_dim": 16,
        "model.decoder.dropout": 0.2,
        "train.output_dir": str(folder / "run"),
        "train.epochs": 12,
        "train.lr": 0.005,
        "train.batch_size": 4,
        "train.deterministic": True,
        "train.schedule": "plateau",
        "train.scst_epochs": 0,
        "train.ema_decay": 0.0,
        "decode.beam_size": 2,
        "decode.max_length": 8,
    }
    with kept_process_state():  # training seeds the generators and sets torch's deterministic mode
        train(load_config(REPO / "configs" / "shapes.yaml", values), progress=False)
    return folder / "run" / "checkpoints" / "best.pt", sorted((folder / "shapes" / "test").glob("*.png"))
