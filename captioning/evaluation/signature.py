"""A short signature saying what produced a set of scores, as sacreBLEU signs its BLEU.

Two scores are comparable only if they were computed the same way on the same references; the
signature names each input that changes the numbers, as ``key:value`` fields joined by ``|``::

    refs:3f2a9c01d4e5|n:5000|tok:ptb|impl:pycocoevalcap-1.2,captioning-0.1.0|chair:released|decode:beam3.max20
    |ckpt:9b1e...|scst:cider-d.eos   (one line)

- ``refs``: sha256 (12 hex digits) of the reference captions scored against (image ids and
  captions, in a canonical order: the same references give the same hash from any file);
- ``n``: number of images scored;
- ``tok``: ``ptb`` (the Stanford tokenizer, via Java) or ``python`` (its Python copy); for captions in
  other languages, the ``data.tokenizer`` they were scored with, with the version of its rules and of
  its segmenter (``whitespace.v2``, ``characters.v2``, ``jieba.v2-0.42.1``);
- ``impl``: the pycocoevalcap version and this package's version;
- ``chair``: the CHAIR word table (``released``: Rohrbach et al.'s; ``extended``: this
  project's), when CHAIR was computed;
- ``decode``: the decoding settings that change captions (not the batch size);
- ``ckpt``: sha256 (12 hex digits) of the checkpoint file (a model folder: its ``model.safetensors``);
  ``results``: of a scored results file;
- ``scst``: the self-critical reward the checkpoint's weights were tuned with (``cider-d.eos``:
  CIDEr-D with ``<end>`` counted as a word, Rennie et al.; ``cider-d.noeos``: without), absent
  for weights trained by cross-entropy only;
- ``clip``: only with CLIP-S: the CLIP model, its pretrained tag and its weights file's sha256 (12
  hex digits), e.g. ``ViT-B-32.openai.a1b2c3d4e5f6``;
- ``inst``: with grounding and CHAIR, sha256 (12 hex digits) of the boxes of the instances files
  (image sizes, every object's category, box and attributes, the category list: the same boxes
  give the same hash from any files), and ``words``: of the CHAIR word table (synonyms, phrases
  that name no object, modifiers);
- ``point``: with attention grounding, the published pointing game's tolerance (``15px``);
- ``faith``: with ``evaluate.py --faithfulness``, every setting of the explanations that changes
  their numbers, derived from the fields of ``captioning.explain.config.ExplainConfig``
  (``signature_part``), the baseline named by its hash, and the images explained.

``decode``, ``ckpt``, ``scst`` and ``results`` describe the system being scored (:data:`SYSTEM_FIELDS`):
two systems differ there by design, while any other difference makes their numbers incomparable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, fields
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.config import DecodeConfig
from captioning.data.tokenizers import tokenizer_version
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords
from captioning.hub.identity import file_hash, parse_signature
from captioning.utils.version import package_version

if TYPE_CHECKING:
    from captioning.evaluation.chair_table import ReleasedChairTable
    from captioning.evaluation.grounding import Instances

SYSTEM_FIELDS = ("decode", "ckpt", "scst", "results")
_DIGITS = 12


def references_hash(references: Mapping[int, Sequence[str]]) -> str:
    """sha256 (first 12 hex digits) of image id -> reference captions, independent of their order."""
    canonical = sorted((str(image_id), list(captions)) for image_id, captions in references.items())
    return hashlib.sha256(json.dumps(canonical, ensure_ascii=False).encode("utf-8")).hexdigest()[:_DIGITS]


def _canonical_hash(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGITS]


def boxes_hash(boxes: Instances) -> str:
    """sha256 (first 12 hex digits) of the boxes (and segmentations) grounding and CHAIR read,
    independent of file order."""
    images = sorted(
        (
            str(image_id),
            list(size),
            sorted(
                [box.category, list(box.bbox), dict(box.attributes)]
                + ([box.segmentation] if box.segmentation is not None else [])
                for box in boxes.objects.get(image_id, ())
            ),
        )
        for image_id, size in boxes.image_sizes.items()
    )
    return _canonical_hash([images, sorted(boxes.categories)])


def words_hash(table: CategoryWords | ReleasedChairTable) -> str:
    """sha256 (first 12 hex digits) of a CHAIR word table: this project's (synonyms, phrases that name
    no object, modifiers) or the released one (synonyms and two-word names)."""
    synonyms = sorted((category, sorted(words)) for category, words in table.synonyms.items())
    if isinstance(table, CategoryWords):
        return _canonical_hash([synonyms, sorted(table.not_objects), sorted(table.modifiers)])
    return _canonical_hash([synonyms, sorted(table.double_words.items())])


# How a decoding option is written in ``decode`` when a short form reads better than ``name=value``:
# a field's function returns its part (None: not written). Only the caption-changing fields of
# DecodeConfig are visited; beam_size is written with the strategy it belongs to.
_DECODE_PARTS: dict[str, Callable[[Any], str | None]] = {
    "strategy": lambda d: d.strategy + (str(d.beam_size) if d.strategy == "beam" else ""),
    "beam_size": lambda d: None,
    "max_length": lambda d: f"max{d.max_length}",
    "min_length": lambda d: f"min{d.min_length}" if d.min_length else None,
    "length_alpha": lambda d: f"alpha{d.length_alpha:g}" if d.length_alpha else None,
    "block_trigrams": lambda d: "notri" if d.block_trigrams else None,
    "temperature": lambda d: f"t{d.temperature:g}" if d.strategy == "sample" else None,
    "top_k": lambda d: f"k{d.top_k}" if d.strategy == "sample" else None,
    "forbid_unk": lambda d: None if d.forbid_unk else "unk",
}

# Decoding options that change how fast captions come, never which: batched decoding equals
# decoding one image at a time.
_NOT_IN_SIGNATURE = frozenset({"batch_size"})


def decode_description(decode: DecodeConfig) -> str:
    """The decoding settings that change the captions, e.g. ``beam3.max20`` or ``sample.max16.t0.7.k5``.

    Every field of the decoding options counts: one with a short form above is written that way,
    any other (a new option) as ``name=value`` whenever it differs from its default, so two
    decodings that differ in an option never share a signature.
    """
    parts = []
    for option in fields(decode):
        if option.name in _NOT_IN_SIGNATURE:
            continue
        value = getattr(decode, option.name)
        if option.name in _DECODE_PARTS:
            part = _DECODE_PARTS[option.name](decode)
        elif value != _default(option):
            part = f"{option.name}={value:g}" if isinstance(value, float) else f"{option.name}={value}"
        else:
            part = None
        if part is not None:
            parts.append(part)
    return ".".join(parts)


def _default(option: Field) -> Any:
    if option.default_factory is not MISSING:
        return option.default_factory()
    return option.default


def _implementation() -> str:
    try:
        toolkit = version("pycocoevalcap")
    except PackageNotFoundError:  # pragma: no cover - it is a dependency
        toolkit = "unknown"
    return f"pycocoevalcap-{toolkit},captioning-{package_version()}"


def make_signature(
    references: Mapping[int, Sequence[str]],
    tokenizer: str,
    decode: DecodeConfig | None = None,
    checkpoint: str | Path | None = None,
    results: str | Path | None = None,
    chair: str | None = None,
    reward: str | None = None,
    clip: str | None = None,
    boxes: Instances | None = None,
    table: CategoryWords | ReleasedChairTable | None = None,
    pointing: float | None = None,
) -> str:
    """The signature of scores of ``len(references)`` images against ``references``.

    Args:
        references: image id -> reference captions that were scored against.
        tokenizer: ``"ptb"``, ``"python"``, ``"whitespace"`` or ``"characters"``
            (:attr:`captioning.evaluation.metrics.Scores.tokenizer`).
        decode: the decoding settings, when the captions were generated here.
        checkpoint: the checkpoint file that generated them, if any.
        results: the results file that was scored, if any.
        chair: the CHAIR word table, when CHAIR was computed.
        reward: the checkpoint's self-critical reward (:func:`reward_description`), when its
            weights had a self-critical stage.
        clip: the CLIP model and weights of CLIP-S (``ClipScorer.description``), when computed.
        boxes, table: the instances' boxes and the word table of grounding and CHAIR, when computed.
        pointing: the published pointing game's tolerance in pixels, when grounding was computed.
    Returns:
        ``key:value|key:value...`` (see the module docstring).
    """
    fields = {
        "refs": references_hash(references),
        "n": str(len(references)),
        "tok": tokenizer_version(tokenizer),
        "impl": _implementation(),
    }
    if chair is not None:
        fields["chair"] = chair
    if decode is not None:
        fields["decode"] = decode_description(decode)
    if checkpoint is not None:
        fields["ckpt"] = file_hash(checkpoint)
    if reward is not None:
        fields["scst"] = reward
    if results is not None:
        fields["results"] = file_hash(results)
    if clip is not None:
        fields["clip"] = clip
    if boxes is not None:
        fields["inst"] = boxes_hash(boxes)
        fields["words"] = words_hash(table if table is not None else COCO_WORDS)
    if pointing is not None:
        fields["point"] = f"{pointing:g}px"
    return "|".join(f"{key}:{value}" for key, value in fields.items())


def signature_differences(first: str, second: str, ignore: Sequence[str] = SYSTEM_FIELDS) -> list[str]:
    """The fields, other than ``ignore``, where two signatures differ: ``["tok: ptb vs python", ...]``."""
    a, b = parse_signature(first), parse_signature(second)
    keys = [key for key in dict.fromkeys([*a, *b]) if key not in ignore]
    return [f"{key}: {a.get(key, '-')} vs {b.get(key, '-')}" for key in keys if a.get(key) != b.get(key)]
