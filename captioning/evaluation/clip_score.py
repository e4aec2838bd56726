"""CLIP-S and RefCLIP-S (Hessel et al. 2021, "CLIPScore: A Reference-free Evaluation Metric for Image
Captioning"), as defined there.

- CLIP ViT-B/32 (OpenAI's weights, through open_clip: the ``clip`` extra) embeds the image (its own
  preprocessing: resize, centre crop, normalisation) and the text ``"A photo depicts " + caption``;
  both embeddings are L2-normalised.
- CLIP-S(c, v) = 2.5 * max(cos(c, v), 0), averaged over images.
- RefCLIP-S(c, R, v) = the harmonic mean of CLIP-S(c, v) and max(max_r cos(c, r), 0), the best
  cosine to a reference caption r (embedded with the same prefix, as the paper's code does).

The weights are resolved as the encoders' (``pretrained`` from the Hugging Face or torch hub cache,
downloaded when online; a file path; nothing is scored with random weights). torchmetrics'
``CLIPScore`` is another quantity (100 * cos with a Hugging Face ViT-L/14 by default, no prefix) and
is not offered under this name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from captioning.config import ConfigError
from captioning.data.images import load_image
from captioning.models.encoders.open_clip_models import load_clip, parse_clip_name
from captioning.models.encoders.weights import file_identity

CLIP_MODEL = "ViT-B-32/openai"  # the paper's CLIP ViT-B/32
TEXT_PREFIX = "A photo depicts"
WEIGHT = 2.5  # w of the paper: rescales CLIP-S to roughly [0, 1]


@dataclass
class ClipScorer:
    """A CLIP model ready to score captions.

    Attributes:
        model: the open_clip model (both towers) in eval mode.
        preprocess: PIL RGB image -> (3, S, S) tensor, open_clip's evaluation transform for these weights.
        tokenize: list of texts -> (N, L) token ids.
        description: ``<arch>/<tag>`` and the weights file's sha256 prefix, for the signature.
    """

    model: Any  # open_clip's CLIP; open_clip has no type hints to name its encode_* methods by
    preprocess: Callable[[Image.Image], torch.Tensor]
    tokenize: Callable[[list[str]], torch.Tensor]
    description: str


def load_clip_scorer(
    weights: str = "pretrained", name: str = CLIP_MODEL, device: torch.device | None = None
) -> ClipScorer:
    """The CLIP model of CLIP-S with ``weights`` ("pretrained" or a file; "none" is refused).

    Raises:
        ConfigError: ``none``, or open_clip not installed.
        EncoderWeightsError: the weights file is missing, unreadable or does not fit (one line).
    """
    if weights == "none":
        raise ConfigError("--clip-score needs CLIP weights: pretrained or a file path, not none")
    model, resolved, open_clip = load_clip(name, weights, setting="--clip-score")
    from open_clip.transform import PreprocessCfg, image_transform_v2

    preprocess = image_transform_v2(
        PreprocessCfg(**open_clip.get_model_preprocess_cfg(model)), is_train=False
    )
    architecture, tag = parse_clip_name(name)
    digest = file_identity(resolved.path)["sha256"][:12] if resolved.path is not None else "none"
    return ClipScorer(
        model.to(device or torch.device("cpu")).eval(),
        preprocess,
        open_clip.get_tokenizer(architecture),
        f"{architecture}.{tag or 'untagged'}.{digest}",
    )


@torch.inference_mode()
def _text_embeddings(scorer: ClipScorer, captions: Sequence[str], batch_size: int) -> torch.Tensor:
    """(N,) captions -> (N, D) L2-normalised embeddings of ``TEXT_PREFIX + " " + caption``."""
    device = next(scorer.model.parameters()).device
    chunks = [
        scorer.model.encode_text(
            scorer.tokenize([f"{TEXT_PREFIX} {c}" for c in captions[i : i + batch_size]]).to(device)
        ).float()
        for i in range(0, len(captions), batch_size)
    ]
    return nn.functional.normalize(torch.cat(chunks), dim=-1)


@torch.inference_mode()
def _image_embeddings(scorer: ClipScorer, images: Sequence[Path], batch_size: int) -> torch.Tensor:
    """(N,) image files -> (N, D) L2-normalised image embeddings."""
    device = next(scorer.model.parameters()).device
    chunks = []
    for start in range(0, len(images), batch_size):
        pixels = torch.stack(
            [scorer.preprocess(load_image(path)) for path in images[start : start + batch_size]]
        )
        chunks.append(scorer.model.encode_image(pixels.to(device)).float())  # (b, D)
    return nn.functional.normalize(torch.cat(chunks), dim=-1)


def harmonic_mean(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Elementwise 2ab / (a + b), 0 where a + b is 0 (both scores are clipped at 0)."""
    total = first + second
    return torch.where(total > 0, 2 * first * second / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)


def clip_scores(
    scorer: ClipScorer,
    images: Mapping[int, Path],
    candidates: Mapping[int, str],
    references: Mapping[int, Sequence[str]] | None = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """CLIP-S (and RefCLIP-S when ``references`` are given) of each image's candidate caption.

    Args:
        scorer: from :func:`load_clip_scorer`.
        images: image id -> image file.
        candidates: image id -> the caption to score (same ids as ``images``).
        references: image id -> reference captions (at least one each).
    Returns:
        ``{"CLIP-S": mean, "RefCLIP-S": mean or None, "per_image": {image id: {"CLIP-S": ..,
        "RefCLIP-S": ..}}}``.
    """
    ids = list(candidates)
    if not ids:
        raise ValueError("no captions to score")
    image_features = _image_embeddings(scorer, [images[i] for i in ids], batch_size)  # (N, D)
    caption_features = _text_embeddings(scorer, [candidates[i] for i in ids], batch_size)  # (N, D)
    clip_s = WEIGHT * (image_features * caption_features).sum(-1).clamp_min(0)  # (N,)
    per_image: dict[int, dict[str, float]] = {
        i: {"CLIP-S": float(v)} for i, v in zip(ids, clip_s.tolist(), strict=True)
    }
    result: dict[str, Any] = {"CLIP-S": float(clip_s.mean()), "RefCLIP-S": None}
    if references is not None:
        flat = [caption for i in ids for caption in references[i]]
        owners = torch.tensor([n for n, i in enumerate(ids) for _ in references[i]])  # (R,)
        reference_features = _text_embeddings(scorer, flat, batch_size)  # (R, D)
        cosines = (reference_features * caption_features[owners]).sum(-1)  # (R,)
        best = torch.full((len(ids),), -1.0).scatter_reduce(0, owners, cosines, reduce="amax")  # (N,)
        ref_clip_s = harmonic_mean(clip_s, best.clamp_min(0))
        for i, value in zip(ids, ref_clip_s.tolist(), strict=True):
            per_image[i]["RefCLIP-S"] = float(value)
        result["RefCLIP-S"] = float(ref_clip_s.mean())
    result["per_image"] = per_image
    return result
