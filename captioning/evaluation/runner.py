"""Decode a split or a folder with a trained checkpoint, write COCO-format results, score them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.config import Config, DecodeConfig
from captioning.data.readers import reader_of
from captioning.data.records import DatasetError
from captioning.data.tokenizers import detokenize
from captioning.evaluation.attributes import add_attributes, attribute_line
from captioning.evaluation.caption_sets import caption_set_measures, how_sets_were_drawn
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.grounding import (
    ImageGrounding,
    Instances,
    WordMatcher,
    grounding_per_image,
    image_grounding_json,
    load_instances,
    merged_grounding,
)
from captioning.evaluation.hallucination import add_chair, chair_line
from captioning.evaluation.java import DEFAULT_TIMEOUT_S
from captioning.evaluation.metrics import EvaluationInputError, score_captions
from captioning.evaluation.pointing import DEFAULT_TOLERANCE
from captioning.evaluation.signature import make_signature, parse_signature
from captioning.inference.captioner import Captioned
from captioning.utils.files import atomic_write, writes_in_place

if TYPE_CHECKING:
    from captioning.evaluation.clip_score import ClipScorer


def write_results(path: str | Path, captioned: list[Captioned], tokenizer: str = "ptb") -> Path:
    """COCO results format ``[{"image_id": ..., "caption": ...}]``, written atomically; ``tokenizer``
    (``data.tokenizer``) chooses how words are joined (:func:`captioning.data.tokenizers.detokenize`)."""
    results = [
        {"image_id": item.record.image_id, "caption": detokenize(item.words, tokenizer)} for item in captioned
    ]
    text = json.dumps(results, indent=1, ensure_ascii=False)
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8", errors="replace"))
    return Path(path)


def write_ranked_results(path: str | Path, captioned: list[Captioned], tokenizer: str = "ptb") -> Path:
    """Every caption of every image (``decode.num_return`` of them, ranked), one row each:
    ``[{"image_id", "rank" (1 = the system's output), "caption", "log_prob", "score"}]``, written
    atomically."""
    rows = [
        {
            "image_id": item.record.image_id,
            "rank": rank,
            "caption": detokenize(ranked.words, tokenizer),
            "log_prob": round(float(ranked.caption.log_prob), 6),
            "score": round(float(ranked.caption.score), 6),
        }
        for item in captioned
        for rank, ranked in enumerate(item.ranked, 1)
    ]
    text = json.dumps(rows, indent=1, ensure_ascii=False)
    atomic_write(path, lambda p: p.write_text(text, encoding="utf-8", errors="replace"))
    return Path(path)


def caption_set_scores(
    captioned: list[Captioned], tokenizer: str = "ptb", with_references: bool = True, strategy: str = "beam"
) -> dict[str, float | str | None]:
    """:func:`captioning.evaluation.caption_sets.caption_set_measures` of the ranked captions of
    ``captioned`` (the oracle against each record's references when ``with_references``), with
    ``sets``: how ``decode.strategy`` drew them (:func:`how_sets_were_drawn`)."""
    sets = {item.record.image_id: [detokenize(r.words, tokenizer) for r in item.ranked] for item in captioned}
    references = (
        {item.record.image_id: list(item.record.raw) for item in captioned} if with_references else None
    )
    measures: dict[str, float | str | None] = dict(caption_set_measures(sets, references, tokenizer))
    measures["sets"] = how_sets_were_drawn(strategy)
    return measures


def default_instances(config: Config) -> tuple[Path, ...]:
    """The instances files grounding uses by default: the configured ones, or the reader's own
    (``DatasetReader.default_instances``: Shapes writes its boxes)."""
    if config.data.instances:
        return tuple(Path(path) for path in config.data.instances)
    return reader_of(config.data).default_instances(config.data)


def load_boxes(paths: Sequence[str | Path]) -> Instances | None:
    """The boxes of several COCO instances files (``instances_train2014.json``, ``instances_val2014.json``)
    as one :class:`Instances` (with every file's categories); None when there are no files.

    Raises:
        EvaluationInputError: a file is missing or malformed, or an image id is in two files.
    """
    if not paths:
        return None
    merged = Instances({}, {})
    source: dict[int, Path] = {}
    categories: dict[str, None] = {}  # ordered union: the first file's order, then new names
    for path in map(Path, paths):
        boxes = load_instances(path)
        for image_id in boxes.image_sizes:
            if image_id in source:
                raise EvaluationInputError(f"{path}: image {image_id}: also in {source[image_id]}")
            source[image_id] = path
        merged.image_sizes.update(boxes.image_sizes)
        merged.objects.update(boxes.objects)
        categories.update(dict.fromkeys(boxes.categories))
    merged.categories = tuple(categories)
    return merged


def add_boxed_scores(
    result: dict,
    boxes: Instances,
    words: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[str]],
    attention: Mapping[int, tuple] | None = None,
    chair: str = "released",
    tolerance: float = DEFAULT_TOLERANCE,
) -> None:
    """Add attention grounding (when ``attention`` is given), CHAIR and, when the boxes annotate
    attributes, attribute hallucination (:mod:`captioning.evaluation.attributes`) to ``result`` in
    place, over the images ``boxes`` cover; ``grounding-images``, ``CHAIR-images`` and
    ``attribute-images`` count them (the others are left out of these only). Each covered image's
    ``per_image`` entry gets its own grounding fields (``grounding-words``, ``grounding-mass``,
    ``grounding-pointing``, ``grounding-pointing-published`` and ``grounding-classes``, its
    published hits and mentions per class), CHAIR fields and attribute fields.

    Args:
        result: the scores being built (with its ``per_image`` list).
        boxes: the annotated objects (:func:`load_boxes`).
        words: image id -> the generated caption's tokens.
        references: image id -> raw reference captions.
        attention: image id -> (attention maps (T, P), grid) of the generated caption.
        chair: CHAIR's word table (:data:`captioning.config.CHAIR_TABLES`); grounding always reads
            captions with the extended one.
        tolerance: the published pointing game's tolerance in pixels.
    """
    covered = [image_id for image_id in words if image_id in boxes.image_sizes]
    matcher = WordMatcher()
    if attention is not None:
        items = [(image_id, words[image_id], *attention[image_id]) for image_id in covered]
        per_image = grounding_per_image(items, boxes, matcher, tolerance)
        result.update(
            image_grounding_json(merged_grounding(per_image), classes=True, categories=boxes.categories)
        )
        result["grounding-images"] = len(covered)
        if "per_image" in result:
            result["per_image"] = [
                {**entry, **image_fields(per_image[entry["image_id"]])}
                if entry.get("image_id") in per_image
                else entry
                for entry in result["per_image"]
            ]
    covered_words = {image_id: words[image_id] for image_id in covered}
    add_chair(result, covered_words, references, boxes, chair_table(chair))
    result["CHAIR-images"] = len(covered)
    add_attributes(result, covered_words, boxes, chair_table(chair))


def image_fields(grounding: ImageGrounding) -> dict[str, Any]:
    """One image's per-image grounding fields: the means of :func:`image_grounding_json` and
    ``grounding-classes``, class -> [published hits, mentions], from which ``--compare`` rebuilds
    the class mean."""
    classes: dict[str, list[float]] = {}
    for hit, name in zip(grounding.published_hits, grounding.classes, strict=True):
        totals = classes.setdefault(name, [0.0, 0.0])
        totals[0] += hit
        totals[1] += 1
    return {**image_grounding_json(grounding), "grounding-classes": classes}


def score_captioned(
    captioned: list[Captioned],
    grid: tuple[int, int],
    boxes: Instances | None = None,
    use_java: bool | None = None,
    spice: bool = False,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    decode: DecodeConfig | None = None,
    checkpoint: Path | None = None,
    chair: str = "released",
    reward: str | None = None,
    clip_scorer: ClipScorer | None = None,
    tokenizer: str = "ptb",
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict:
    """Caption metrics against each record's references, plus attention grounding and CHAIR (with the
    word table ``chair``) on the images ``boxes`` cover (``grounding-images`` and ``CHAIR-images`` of
    them; the others are left out of these only), CLIP-S and RefCLIP-S with ``clip_scorer`` (also per
    image), and the signature of the scores (``decode``, ``checkpoint`` and its self-critical
    ``reward`` describe the system). ``tokenizer``: the checkpoint's ``data.tokenizer``, which the
    metrics tokenize with; ``tolerance``: the published pointing game's, in pixels (in the signature)."""
    references = {item.record.image_id: list(item.record.raw) for item in captioned}
    candidates = {item.record.image_id: detokenize(item.words, tokenizer) for item in captioned}
    scores = score_captions(
        references, candidates, use_java=use_java, spice=spice, java_timeout=java_timeout, tokenizer=tokenizer
    )
    result = scores.to_json()
    result["per_image"] = scores.per_image_json()
    result["table"] = scores.table()
    if boxes is not None:
        add_boxed_scores(
            result,
            boxes,
            {item.record.image_id: item.words for item in captioned},
            references,
            {item.record.image_id: (item.caption.attention.numpy(), grid) for item in captioned},
            chair,
            tolerance,
        )
    if clip_scorer is not None:
        from captioning.evaluation.clip_score import clip_scores

        clip = clip_scores(
            clip_scorer,
            {item.record.image_id: item.record.path for item in captioned},
            candidates,
            references,
        )
        result["CLIP-S"], result["RefCLIP-S"] = clip["CLIP-S"], clip["RefCLIP-S"]
        for entry in result["per_image"]:
            entry.update(clip["per_image"][entry["image_id"]])
    result["signature"] = make_signature(
        references,
        scores.tokenizer,
        decode,
        checkpoint,
        chair=chair if boxes is not None else None,
        reward=reward,
        clip=clip_scorer.description if clip_scorer is not None else None,
        boxes=boxes,
        table=chair_table(chair) if boxes is not None else None,
        pointing=tolerance if boxes is not None else None,
    )
    return result


def clip_line(scores: Mapping[str, Any]) -> str | None:
    """The summary line of CLIP-S and RefCLIP-S (None when they were not computed)."""
    if scores.get("CLIP-S") is None:
        return None
    return (
        f"CLIP-S {scores['CLIP-S']:.4f}, RefCLIP-S {scores['RefCLIP-S']:.4f} "
        f"(Hessel et al. 2021: CLIP {parse_signature(scores['signature']).get('clip', '?')})"
    )


def grounding_line(scores: Mapping[str, Any], images: int) -> str | None:
    """The one summary line of attention grounding (None when it was not measured), rounded."""
    if "grounding-images" not in scores:
        return None
    covered = scores["grounding-images"]
    if not covered:
        return f"grounding: none of the {images} images has boxes in the instances files"
    if not scores["grounding-words"]:
        return (
            "grounding: no generated word names an annotated object "
            f"({covered} of {images} images with boxes)"
        )
    published = scores.get("grounding-pointing-published")
    tolerance = parse_signature(scores.get("signature", "")).get("point", "?")
    return (
        f"grounding: attention mass in the named object's box {scores['grounding-mass']:.3f}; pointing game "
        f"(strict: most attended cell's centre in the box) {scores['grounding-pointing']:.3f}"
        + (
            f"; pointing game (published, Zhang et al. 2016: maximum within {tolerance} of the object) "
            f"{published:.3f} per mention, {_rate(scores.get('grounding-pointing-published-classes'))} per "
            "category (every category of the instances files, one never named counting 0), "
            f"{_rate(scores.get('grounding-pointing-published-mentioned-classes'))} per class named"
            if published is not None
            else ""
        )
        + f"; over {scores['grounding-words']} object words in {covered} of {images} images with boxes"
    )


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary_lines(scores: Mapping[str, Any], images: int) -> list[str]:
    """The lines printed under the scores table: grounding, CHAIR and attribute hallucination when
    measured, the signature last."""
    lines = [
        line
        for line in (
            grounding_line(scores, images),
            chair_line(scores),
            attribute_line(scores),
            clip_line(scores),
        )
        if line is not None
    ]
    return [*lines, f"signature: {scores['signature']}"]


def write_scores(path: str | Path, scores: dict) -> tuple[Path, Path | None]:
    """``<name>.json`` with the overall numbers and ``<name>.per_image.json`` beside it (none beside a
    device or a FIFO: see ``per_image_path``)."""
    path = Path(path)
    per_image = per_image_path(path)
    overall = {k: v for k, v in scores.items() if k not in ("per_image", "table")}
    atomic_write(path, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))
    if per_image is not None:
        atomic_write(
            per_image, lambda p: p.write_text(json.dumps(scores.get("per_image", [])), encoding="utf-8")
        )
    return path, per_image


def per_image_path(scores_path: str | Path) -> Path | None:
    """``x_scores.json`` -> ``x_scores.per_image.json``: where ``write_scores`` puts per-image scores;
    None when the scores go into a device, a FIFO or a shell's descriptor (``/dev/null``, ``/dev/stdout``),
    whose folder is no place for a second file."""
    scores_path = Path(scores_path)
    if writes_in_place(scores_path):
        return None
    return scores_path.with_name(scores_path.stem + ".per_image.json")


def score_results_file(
    annotations: str | Path,
    results: str | Path,
    use_java: bool | None = None,
    spice: bool = False,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    boxes: Instances | None = None,
    chair: str = "released",
    tokenizer: str = "ptb",
) -> dict:
    """Score a COCO results file against COCO-format reference captions, as the official toolkit does
    (``tokenizer``: as for :func:`score_captions`), with CHAIR (word table ``chair``) on the images
    ``boxes`` cover (:func:`load_boxes`) when given."""
    from captioning.data.tokenizers import tokenize
    from captioning.evaluation.coco_files import load_coco_references, load_results

    references = load_coco_references(annotations)
    candidates = load_results(results)
    if not candidates:
        raise DatasetError(f"{results}: holds no results (an empty list); nothing to score")
    missing = sorted(set(candidates) - set(references))
    if missing:
        raise DatasetError(f"{results}: image_id {missing[0]} has no reference captions in {annotations}")
    references = {image_id: references[image_id] for image_id in candidates}
    scores = score_captions(
        references, candidates, use_java=use_java, spice=spice, java_timeout=java_timeout, tokenizer=tokenizer
    )
    result = {**scores.to_json(), "per_image": scores.per_image_json(), "table": scores.table()}
    if boxes is not None:
        add_boxed_scores(
            result,
            boxes,
            {i: tokenize(caption) for i, caption in candidates.items()},
            references,
            chair=chair,
        )
    result["signature"] = make_signature(
        references,
        scores.tokenizer,
        results=results,
        chair=chair if boxes is not None else None,
        boxes=boxes,
        table=chair_table(chair) if boxes is not None else None,
    )
    return result
