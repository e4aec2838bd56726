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
from captioning.explain.captions import baseline_of, curve_settings, explain_batch, method_settings
from captioning.explain.config import ExplainConfig
from captioning.explain.faithfulness import WordCurves, method_curves, random_curves, summarise
from captioning.explain.hallucinated_maps import hallucination_peaks
from captioning.explain.methods import parse_methods
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


@dataclass
class _Collected:
    per_method: dict[str, list[WordCurves]] = field(default_factory=dict)
    control: list[list[WordCurves]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    word_images: list[int] = field(default_factory=list)
    explained: list[Explained] = field(default_factory=list)
    pixel_per_method: dict[str, list[PixelWordCurves]] = field(default_factory=dict)
    pixel_control: list[list[PixelWordCurves]] = field(default_factory=list)


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
    collected = _Collected({name: [] for name in methods})
    batches = range(0, annotations.size(0), settings.batch_images)
    for first in tqdm(batches, desc="explaining", disable=not progress, leave=False, unit="batch"):
        part = slice(first, min(annotations.size(0), first + settings.batch_images))
        maps = _study_batch(
            collected, decoder, annotations, tokens, baseline, methods, settings, part, pixels
        )
        _collect_explained(collected, maps, methods, words, image_ids, part, grid, instances)
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
        _add_grounding(result, collected.explained, instances, references, methods, settings, bootstrap)
    return result


def _study_batch(
    collected: _Collected,
    decoder: CaptionDecoder,
    annotations: Tensor,
    tokens: Sequence[Sequence[int]],
    baseline: Tensor,
    methods: Sequence[str],
    settings: ExplainConfig,
    part: slice,
    pixels: PixelInputs | None,
) -> dict[str, Tensor]:
    """The maps (B, T, P) per method of the images ``part``; their words' deletion and insertion
    curves, the random control's and (with ``pixels``) the pixel curves go into ``collected``."""
    grids, base = annotations[part], baseline_of(baseline, part)
    maps, scorer = explain_batch(
        decoder, grids, tokens[part], methods, base, method_settings(settings), settings.score
    )
    curving = curve_settings(settings)
    index = scorer.word_mask.nonzero()  # (W, 2): (caption row, word)
    images = index[:, 0] + part.start  # each word's image in the study: seeds its random orders
    for name in methods:
        chosen = maps[name][index[:, 0], index[:, 1]]  # (W, P)
        collected.per_method[name].append(
            method_curves(scorer.words_at, grids, base, chosen, index, curving, images)
        )
    collected.control.append(random_curves(scorer.words_at, grids, base, index, curving, images))
    if pixels is not None and settings.pixel is not None:
        _pixel_batch(collected, pixels, part, scorer, maps, index, settings)
    return maps


def _collect_explained(
    collected: _Collected,
    maps: Mapping[str, Tensor],
    methods: Sequence[str],
    words: Sequence[Sequence[str]],
    image_ids: Sequence[int],
    part: slice,
    grid: tuple[int, int],
    instances: Instances | None,
) -> None:
    """Each image of ``part``: its words' classes and image ids, and its maps per method (each
    (T, P) cut to its caption's words) as an :class:`Explained`, added to ``collected``."""
    for row, image_id in enumerate(image_ids[part]):
        caption = list(words[part.start + row])
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


def _add_grounding(
    result: dict,
    explained: Sequence[Explained],
    instances: Instances,
    references: Mapping[int, Sequence[Sequence[str]]] | None,
    methods: Sequence[str],
    settings: ExplainConfig,
    bootstrap: BootstrapSettings,
) -> None:
    """The table's grounding and hallucinated-mention columns: ``result["hallucination"]``,
    ``result["hallucination_peaks"]`` and each method's row's grounding, pointing and mention masses."""
    grounding = grounding_rows(explained, instances, settings.pointing_tolerance)
    intervals = grounding_intervals(explained, instances, settings.pointing_tolerance, bootstrap)
    mentions = mention_rows(explained, instances, references)
    hallucination = hallucination_summary(mentions, methods)
    result["hallucination"] = hallucination
    result["hallucination_peaks"] = hallucination_peaks(explained, instances, mentions, methods)
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
    base, explaining = baseline_of(baseline, slice(0, count)), method_settings(settings)
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
