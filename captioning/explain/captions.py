"""Each caption's maps per attribution method and its words' deletion and insertion curves.

The batches every explaining tool shares: the faithfulness study (:mod:`captioning.explain.study`),
``model.explain`` (:mod:`captioning.explain.explaining`) and ``visualize.py --method``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from captioning.explain.config import ExplainConfig
from captioning.explain.faithfulness import CurveSettings, method_curves
from captioning.explain.methods import ExplainInputs, ExplainSettings, explain
from captioning.explain.pixel_curves import PixelInputs, PixelWordCurves, method_pixel_curves
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.models.base import CaptionDecoder


def method_settings(config: ExplainConfig) -> ExplainSettings:
    """What the methods read of ``config``."""
    return ExplainSettings(config.ig_steps, config.batch_rows)


def curve_settings(config: ExplainConfig) -> CurveSettings:
    """What the curves read of ``config``."""
    return CurveSettings(config.curve_steps, config.random_seeds, config.batch_rows, config.order_seed)


def baseline_of(baseline: Tensor, part: slice) -> Tensor:
    """A (C,) baseline as it is; a (N, P, C) one's images ``part``."""
    return baseline if baseline.dim() == 1 else baseline[part]


def explain_batch(
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    methods: Sequence[str],
    baseline: Tensor,
    settings: ExplainSettings,
    score: str = "log_prob",
) -> tuple[dict[str, Tensor], WordScorer]:
    """Each method's maps (B, T, P) of B captions (word ids without ``<start>``/``<end>``) of B grids,
    explaining each word's ``score`` (``ExplainConfig.score``); ``baseline`` (C,) or (B, P, C)."""
    captions, lengths = caption_tensor(tokens)
    scorer = WordScorer(decoder, captions.to(annotations.device), lengths.to(annotations.device), score)
    inputs = ExplainInputs(scorer, annotations, baseline, settings)
    return {name: explain(name, inputs) for name in methods}, scorer


@dataclass
class WordExplanation:
    """One caption's maps and curves, numpy arrays throughout.

    Attributes:
        maps: method -> (T, P) float32 maps of its T words.
        deletion, insertion: method -> (T, K) the word's probability after each point of the curve.
        deletion_auc, insertion_auc: method -> (T,) the areas (trapezoid over ``shares``).
        shares: (K,) the share of the grid's cells changed at each point (empty without curves).
        pixel_deletion, pixel_insertion, pixel_deletion_auc, pixel_insertion_auc: the same in pixel
            space (:mod:`captioning.explain.pixel_curves`; (T, n + 1) curves, RISE's areas), empty
            without them.
    """

    maps: dict[str, np.ndarray]
    deletion: dict[str, np.ndarray]
    insertion: dict[str, np.ndarray]
    deletion_auc: dict[str, np.ndarray]
    insertion_auc: dict[str, np.ndarray]
    shares: np.ndarray
    pixel_deletion: dict[str, np.ndarray] = field(default_factory=dict)
    pixel_insertion: dict[str, np.ndarray] = field(default_factory=dict)
    pixel_deletion_auc: dict[str, np.ndarray] = field(default_factory=dict)
    pixel_insertion_auc: dict[str, np.ndarray] = field(default_factory=dict)


def explain_captions(
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    methods: Sequence[str],
    baseline: Tensor,
    settings: ExplainConfig,
    curves: bool = True,
    pixels: PixelInputs | None = None,
) -> list[WordExplanation]:
    """Each method's maps of B captions of B grids (B, P, C) and, with ``curves``, each word's
    deletion and insertion curves (empty dicts without); ``baseline`` (C,) or (B, P, C); with
    ``pixels`` and ``settings.pixel_steps``, its curves in pixel space too."""
    explaining, curving = method_settings(settings), curve_settings(settings)
    explanations = []
    for first in range(0, annotations.size(0), settings.batch_images):
        part = slice(first, min(annotations.size(0), first + settings.batch_images))
        grids, base = annotations[part], baseline_of(baseline, part)
        maps, scorer = explain_batch(decoder, grids, tokens[part], methods, base, explaining, settings.score)
        index = scorer.word_mask.nonzero()
        images = index[:, 0] + first
        results = {
            name: method_curves(
                scorer.words_at, grids, base, maps[name][index[:, 0], index[:, 1]], index, curving, images
            )
            for name in (methods if curves else ())
        }
        points = _numpy(next(iter(results.values())).points) if results else np.zeros(0)
        on_pixels: dict[str, PixelWordCurves] = {}
        if pixels is not None and settings.pixel is not None:
            images_part = pixels.images(first, part.stop)
            on_pixels = {
                name: method_pixel_curves(
                    pixels.encode,
                    scorer.words_at,
                    images_part,
                    maps[name][index[:, 0], index[:, 1]],
                    index,
                    pixels.grid,
                    settings.pixel,
                )
                for name in methods
            }

        for row in range(grids.size(0)):
            count, mine = len(tokens[first + row]), index[:, 0] == row
            explanations.append(
                WordExplanation(
                    {name: _numpy(maps[name][row, :count]) for name in methods},
                    {name: _numpy(result.deletion[mine]) for name, result in results.items()},
                    {name: _numpy(result.insertion[mine]) for name, result in results.items()},
                    {name: _numpy(result.deletion_area[mine]) for name, result in results.items()},
                    {name: _numpy(result.insertion_area[mine]) for name, result in results.items()},
                    points,
                    {name: _numpy(result.deletion[mine]) for name, result in on_pixels.items()},
                    {name: _numpy(result.insertion[mine]) for name, result in on_pixels.items()},
                    {name: _numpy(result.deletion_area[mine]) for name, result in on_pixels.items()},
                    {name: _numpy(result.insertion_area[mine]) for name, result in on_pixels.items()},
                )
            )
    return explanations


def _numpy(values: Tensor) -> np.ndarray:
    return values.detach().cpu().numpy()
