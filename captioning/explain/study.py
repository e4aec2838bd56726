"""The faithfulness table of a captioned split: every method's curves, the random control, the sanity
check, grounding and hallucinated mentions, in one pass over the images.

What ``evaluate.py --faithfulness`` writes into the scores (``faithfulness``), what the run report
shows and what ``docs/attention-and-report.md`` tabulates for the demo models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captioning.evaluation.grounding import Instances
from captioning.explain.config import ExplainConfig
from captioning.explain.faithfulness import CurveSettings, WordCurves, method_curves, random_curves, summarise
from captioning.explain.hallucinated_maps import hallucination_peaks
from captioning.explain.methods import ExplainInputs, ExplainSettings, explain, parse_methods
from captioning.explain.pixel_curves import (
    PixelInputs,
    PixelWordCurves,
    joined,
    method_pixel_curves,
    random_pixel_curves,
    rank_agreement,
)
from captioning.explain.plausibility import (
    WORD_CLASSES,
    Explained,
    grounding_rows,
    hallucination_summary,
    mention_rows,
    word_classes,
)
from captioning.explain.sanity import data_randomisation_test, final_similarities, randomisation_test
from captioning.explain.scoring import WordScorer, caption_tensor
from captioning.explain.statistics import (
    BootstrapSettings,
    add_statistics,
    grounding_intervals,
    number_of_tests,
)
from captioning.models.base import CaptionDecoder

FaithfulnessSettings = ExplainConfig  # the study's settings are the explain settings


def method_settings(config: ExplainConfig) -> ExplainSettings:
    """What the methods read of ``config``."""
    return ExplainSettings(config.ig_steps, config.batch_rows)


def curve_settings(config: ExplainConfig) -> CurveSettings:
    """What the curves read of ``config``."""
    return CurveSettings(config.curve_steps, config.random_seeds, config.batch_rows, config.order_seed)


def _baseline_of(baseline: Tensor, part: slice) -> Tensor:
    """A (C,) baseline as it is; a (N, P, C) one's images ``part``."""
    return baseline if baseline.dim() == 1 else baseline[part]


@dataclass
class _Collected:
    per_method: dict[str, list[WordCurves]] = field(default_factory=dict)
    control: list[list[WordCurves]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    word_images: list[int] = field(default_factory=list)
    explained: list[Explained] = field(default_factory=list)
    pixel_per_method: dict[str, list[PixelWordCurves]] = field(default_factory=dict)
    pixel_control: list[list[PixelWordCurves]] = field(default_factory=list)


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


def faithfulness_study(
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    words: Sequence[Sequence[str]],
    image_ids: Sequence[int],
    grid: tuple[int, int],
    settings: ExplainConfig,
    baseline: Tensor,
    instances: Instances | None = None,
    references: Mapping[int, Sequence[Sequence[str]]] | None = None,
    progress: bool = True,
    maps_out: list[Explained] | None = None,
    bootstrap: BootstrapSettings | None = None,
    shuffled: CaptionDecoder | None = None,
    pixels: PixelInputs | None = None,
) -> dict:
    """The faithfulness table of N captioned images.

    Args:
        decoder: the model's decoder (eval mode).
        annotations: (N, P, C) the images' grids.
        tokens: each caption's word ids (``Caption.tokens``); words: the same as words.
        image_ids: the images' ids (for grounding, hallucination and the per-image rows).
        grid: (gh, gw), P = gh * gw.
        settings: methods and options.
        baseline: (C,) or (N, P, C), what a removed cell holds (``captioning.explain.baselines``).
        instances: boxes, for grounding and hallucinated mentions (optional).
        references: image id -> tokenised reference captions (CHAIR's objects named by them).
        maps_out: when given, receives each image's maps per method (:class:`Explained`), in order
            (for a page that draws them).
        bootstrap: the resampling of the rows' intervals and tests (:mod:`captioning.explain.statistics`).
        shuffled: a decoder of the same family and vocabulary trained on shuffled captions
            (``data.shuffle_captions``): the data randomisation test on the sanity images.
        pixels: the images and the encoder, for the pixel curves (``settings.pixel_steps``; the
            table then holds ``"pixel"``, :func:`_pixel_table`).
    Returns:
        ``{"settings", "statistics", "methods": {method: row}, "random", "paired", "by_word_class",
        "sanity", "data_randomisation" (with ``shuffled``), "hallucination", "hallucination_peaks",
        "per_image"}`` (JSON values); each row holds its n images and words, its areas' and gaps'
        intervals and the gaps' tests; ``hallucination_peaks``:
        :func:`captioning.explain.hallucinated_maps.hallucination_peaks`.
    """
    bootstrap = bootstrap or BootstrapSettings()
    methods = parse_methods(",".join(settings.methods), decoder)
    explaining, curving = method_settings(settings), curve_settings(settings)
    collected = _Collected({name: [] for name in methods})
    batches = range(0, annotations.size(0), settings.batch_images)
    for first in tqdm(batches, desc="explaining", disable=not progress, leave=False, unit="batch"):
        part = slice(first, min(annotations.size(0), first + settings.batch_images))
        grids, base = annotations[part], _baseline_of(baseline, part)
        maps, scorer = explain_batch(decoder, grids, tokens[part], methods, base, explaining, settings.score)
        index = scorer.word_mask.nonzero()  # (W, 2): (caption row, word)
        images = index[:, 0] + first  # each word's image in the study: seeds its random orders
        for name in methods:
            chosen = maps[name][index[:, 0], index[:, 1]]  # (W, P)
            collected.per_method[name].append(
                method_curves(scorer.words_at, grids, base, chosen, index, curving, images)
            )
        collected.control.append(random_curves(scorer.words_at, grids, base, index, curving, images))
        if pixels is not None and settings.pixel is not None:
            _pixel_batch(collected, pixels, part, scorer, maps, index, settings)
        for row, image_id in enumerate(image_ids[part]):
            caption = list(words[first + row])
            collected.classes += word_classes(caption, instances)
            collected.word_images += [image_id] * len(caption)
            collected.explained.append(
                Explained(
                    image_id,
                    caption,
                    {name: maps[name][row, : len(caption)].cpu().numpy() for name in methods},
                    grid,
                )
            )
    if maps_out is not None:
        maps_out.extend(collected.explained)
    per_method = {name: _joined(parts) for name, parts in collected.per_method.items()}
    control = [_joined([batch[seed] for batch in collected.control]) for seed in range(settings.random_seeds)]
    result: dict = {"settings": settings_json(settings), **_tables(per_method, control, collected, bootstrap)}
    result["per_image"] = _per_image(per_method, control, collected.word_images)
    if collected.pixel_control:
        result["pixel"] = _pixel_table(collected, result["methods"], settings, bootstrap)
    if settings.sanity_images:
        _sanity(result, decoder, annotations, tokens, methods, baseline, grid, settings, shuffled)
    if instances is not None:
        grounding = grounding_rows(collected.explained, instances, settings.pointing_tolerance)
        intervals = grounding_intervals(
            collected.explained, instances, settings.pointing_tolerance, bootstrap
        )
        mentions = mention_rows(collected.explained, instances, references)
        hallucination = hallucination_summary(mentions, methods)
        result["hallucination"] = hallucination
        result["hallucination_peaks"] = hallucination_peaks(collected.explained, instances, mentions, methods)
        for name in methods:
            result["methods"][name].update(
                {
                    "grounding_mass": grounding[name]["mass"],
                    "pointing": grounding[name]["pointing"],
                    "pointing_published": grounding[name]["pointing_published"],
                    "pointing_published_classes": grounding[name]["pointing_published_classes"],
                    "grounding_mentions": grounding[name]["mentions"],
                    "hallucinated_object_mass": hallucination[name]["hallucinated"]["object_mass"],
                    "grounded_object_mass": hallucination[name]["grounded"]["object_mass"],
                    "hallucinated_entropy": hallucination[name]["hallucinated"]["entropy"],
                    "grounded_entropy": hallucination[name]["grounded"]["entropy"],
                    **intervals.get(name, {}),
                }
            )
    return result


def _pixel_batch(
    collected: _Collected,
    pixels: PixelInputs,
    part: slice,
    scorer: WordScorer,
    maps: Mapping[str, Tensor],
    index: Tensor,
    settings: ExplainConfig,
) -> None:
    """The pixel curves of one batch's words (``index`` (W, 2)): each method's and the control's."""
    pixel = settings.pixel
    assert pixel is not None
    images = pixels.images(part.start, part.stop)  # (b, 3, H, W)
    for name, method_maps in maps.items():
        chosen = method_maps[index[:, 0], index[:, 1]]  # (W, P)
        collected.pixel_per_method.setdefault(name, []).append(
            method_pixel_curves(pixels.encode, scorer.words_at, images, chosen, index, pixels.grid, pixel)
        )
    collected.pixel_control.append(
        random_pixel_curves(pixels.encode, scorer.words_at, images, index, settings.random_seeds, pixel)
    )


def _pixel_table(
    collected: _Collected, grid_rows: dict[str, dict], settings: ExplainConfig, bootstrap: BootstrapSettings
) -> dict:
    """The pixel protocol's rows as the grid's (``statistics``, ``random``, ``methods``, ``paired``,
    ``by_word_class``, ``per_image``, with their intervals and tests), and ``rank_agreement``: whether
    the two protocols rank the methods alike."""
    per_method: dict[str, WordCurves] = {
        name: joined(parts) for name, parts in collected.pixel_per_method.items()
    }
    control: list[WordCurves] = [
        joined([batch[seed] for batch in collected.pixel_control]) for seed in range(settings.random_seeds)
    ]
    result = _tables(per_method, control, collected, bootstrap)
    result["per_image"] = _per_image(per_method, control, collected.word_images)
    result["rank_agreement"] = rank_agreement(grid_rows, result["methods"])
    return result


def _tables(
    per_method: Mapping[str, WordCurves],
    control: Sequence[WordCurves],
    collected: _Collected,
    bootstrap: BootstrapSettings,
) -> dict:
    """The rows of every word and of each word class, with their n, intervals and tests:
    ``{"statistics", "random", "methods", "paired", "by_word_class"}``."""
    # float64: an image's mean area times its words is then the sum its bootstrap resamples
    areas = {
        name: (r.deletion_area.double().numpy(), r.insertion_area.double().numpy())
        for name, r in per_method.items()
    }
    control_areas = [(c.deletion_area.double().numpy(), c.insertion_area.double().numpy()) for c in control]

    def rows_of(select: np.ndarray, pairs: bool) -> tuple[dict, list]:
        rows = summarise(dict(per_method), list(control), torch.from_numpy(select))
        return rows, add_statistics(
            rows, areas, control_areas, collected.word_images, select, bootstrap, pairs
        )

    table, paired = rows_of(np.ones(len(collected.classes), dtype=bool), True)
    statistics = bootstrap.describe(number_of_tests(len(per_method)))
    statistics.update(images=len(collected.explained), words=len(collected.classes))
    return {
        "statistics": statistics,
        "random": table.pop("random"),
        "methods": table,
        "paired": paired,
        "by_word_class": {
            word_class: rows_of(np.array([c == word_class for c in collected.classes], dtype=bool), False)[0]
            for word_class in WORD_CLASSES
        },
    }


def settings_json(settings: ExplainConfig) -> dict:
    """The settings as JSON values (every field)."""
    return {
        item.name: list(v) if isinstance(v := getattr(settings, item.name), tuple) else v
        for item in fields(settings)
    }


def _sanity(
    result: dict,
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    methods: Sequence[str],
    baseline: Tensor,
    grid: tuple[int, int],
    settings: ExplainConfig,
    shuffled: CaptionDecoder | None,
) -> None:
    """Adebayo et al.'s randomisation tests on the first ``sanity_images`` images, into ``result``."""
    count = min(settings.sanity_images, annotations.size(0))
    grids, captions = annotations[:count], tokens[:count]
    base, explaining = _baseline_of(baseline, slice(0, count)), method_settings(settings)
    trained: dict[str, Tensor] = {}

    def maps_of(model: CaptionDecoder) -> dict[str, Tensor]:
        if model is decoder and trained:  # the trained model's maps, made once for both tests
            return trained
        maps = explain_batch(model, grids, captions, methods, base, explaining, settings.score)[0]
        if model is decoder:
            trained.update(maps)
        return maps

    mask = WordScorer(decoder, *caption_tensor(tokens[:count])).word_mask.to(annotations.device)
    sanity = randomisation_test(
        decoder,
        maps_of,
        mask,
        grid,
        settings.similarity_size,
        independent=settings.sanity_randomisation == "both",
        threshold=settings.sanity_threshold,
    )
    result["sanity"] = sanity
    for name in methods:
        result["methods"][name].update(final_similarities(sanity, name))
        result["methods"][name]["sanity_flagged"] = sanity["flag"][name]
    if shuffled is not None:
        shuffled.eval()
        test = data_randomisation_test(
            maps_of(decoder), maps_of(shuffled), mask, grid, settings.similarity_size
        )
        result["data_randomisation"] = test
        for name in methods:
            for measure, value in test["methods"][name].items():
                if not measure.startswith("words_"):
                    result["methods"][name][f"data_randomisation_{measure}"] = value


def _joined(parts: Sequence[WordCurves]) -> WordCurves:
    return WordCurves(
        torch.cat([p.deletion for p in parts]), torch.cat([p.insertion for p in parts]), parts[0].shares
    )


def _per_image(
    per_method: Mapping[str, WordCurves], control: Sequence[WordCurves], word_images: Sequence[int]
) -> list:
    """Per image, its number of words and each method's (and the control's mean) deletion and
    insertion areas over its words: the rows a paired bootstrap of two studies resamples."""
    images = np.asarray(word_images)
    # in float64: an image's mean times its words is the sum the bootstrap of its words resamples
    random_deletion = torch.stack([c.deletion_area.double() for c in control]).mean(0).numpy()
    random_insertion = torch.stack([c.insertion_area.double() for c in control]).mean(0).numpy()
    rows = []
    for image_id in dict.fromkeys(word_images):
        chosen = images == image_id
        row: dict = {
            "image_id": int(image_id),
            "words": int(chosen.sum()),
            "random": {
                "deletion_auc": float(random_deletion[chosen].mean()),
                "insertion_auc": float(random_insertion[chosen].mean()),
            },
        }
        for name, result in per_method.items():
            row[name] = {
                "deletion_auc": float(result.deletion_area.double().numpy()[chosen].mean()),
                "insertion_auc": float(result.insertion_area.double().numpy()[chosen].mean()),
            }
        rows.append(row)
    return rows


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
        grids, base = annotations[part], _baseline_of(baseline, part)
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
