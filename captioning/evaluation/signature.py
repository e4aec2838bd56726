"""A short signature saying what produced a set of scores, as sacreBLEU signs its BLEU.

Two scores are comparable only if they were computed the same way on the same references; the
signature names each input that changes the numbers, as ``key:value`` fields joined by ``|``::

    refs:3f2a9c01d4e5|n:5000|tok:ptb|impl:pycocoevalcap-1.2,captioning-0.1.0|decode:beam3.max20|ckpt:9b1e...

- ``refs``: sha256 (12 hex digits) of the reference captions scored against (image ids and
  captions, in a canonical order: the same references give the same hash from any file);
- ``n``: number of images scored;
- ``tok``: ``ptb`` (the Stanford tokenizer, via Java) or ``python``;
- ``impl``: the pycocoevalcap version and this package's version;
- ``decode``: the decoding settings that change captions (not the batch size);
- ``ckpt``: sha256 (12 hex digits) of the checkpoint file; ``results``: of a scored results file;
- ``inst``: with grounding and CHAIR, sha256 (12 hex digits) of the boxes of the instances files
  (image sizes, every object's category, box and attributes, the category list: the same boxes
  give the same hash from any files), and ``words``: of the CHAIR word table (synonyms, phrases
  that name no object, modifiers).

``decode``, ``ckpt`` and ``results`` describe the system being scored (:data:`SYSTEM_FIELDS`):
two systems differ there by design, while any other difference makes their numbers incomparable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import captioning
from captioning.config import DecodeConfig
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords

if TYPE_CHECKING:
    from captioning.evaluation.grounding import Instances

SYSTEM_FIELDS = ("decode", "ckpt", "results")
_DIGITS = 12


def references_hash(references: Mapping[int, Sequence[str]]) -> str:
    """sha256 (first 12 hex digits) of image id -> reference captions, independent of their order."""
    canonical = sorted((str(image_id), list(captions)) for image_id, captions in references.items())
    return hashlib.sha256(json.dumps(canonical, ensure_ascii=False).encode("utf-8")).hexdigest()[:_DIGITS]


def _canonical_hash(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGITS]


def boxes_hash(boxes: Instances) -> str:
    """sha256 (first 12 hex digits) of the boxes grounding and CHAIR read, independent of file order."""
    images = sorted((str(image_id), list(size), sorted([box.category, list(box.bbox), dict(box.attributes)]
                                                      for box in boxes.objects.get(image_id, ())))
                    for image_id, size in boxes.image_sizes.items())
    return _canonical_hash([images, sorted(boxes.categories)])


def words_hash(table: CategoryWords) -> str:
    """sha256 (first 12 hex digits) of a CHAIR word table."""
    return _canonical_hash([sorted((category, sorted(words)) for category, words in table.synonyms.items()),
                            sorted(table.not_objects), sorted(table.modifiers)])


def file_hash(path: str | Path) -> str:
    """sha256 (first 12 hex digits) of a file's bytes."""
    from captioning.models.encoders import file_identity

    return file_identity(Path(path))["sha256"][:_DIGITS]


def decode_description(decode: DecodeConfig) -> str:
    """The decoding settings that change the captions, e.g. ``beam3.max20`` or ``sample.max16.t0.7.k5``."""
    parts = [decode.strategy + (str(decode.beam_size) if decode.strategy == "beam" else ""),
             f"max{decode.max_length}"]
    if decode.min_length:
        parts.append(f"min{decode.min_length}")
    if decode.length_alpha:
        parts.append(f"alpha{decode.length_alpha:g}")
    if decode.block_trigrams:
        parts.append("notri")
    if decode.strategy == "sample":
        parts.append(f"t{decode.temperature:g}.k{decode.top_k}")
    if not decode.forbid_unk:
        parts.append("unk")
    return ".".join(parts)


def _implementation() -> str:
    try:
        toolkit = version("pycocoevalcap")
    except PackageNotFoundError:  # pragma: no cover - it is a dependency
        toolkit = "unknown"
    return f"pycocoevalcap-{toolkit},captioning-{captioning.__version__}"


def make_signature(references: Mapping[int, Sequence[str]], tokenizer: str, decode: DecodeConfig | None = None,
                   checkpoint: str | Path | None = None, results: str | Path | None = None,
                   boxes: Instances | None = None, table: CategoryWords | None = None) -> str:
    """The signature of scores of ``len(references)`` images against ``references``.

    Args:
        references: image id -> reference captions that were scored against.
        tokenizer: ``"ptb"`` or ``"python"`` (:attr:`captioning.evaluation.metrics.Scores.tokenizer`).
        decode: the decoding settings, when the captions were generated here.
        checkpoint: the checkpoint file that generated them, if any.
        results: the results file that was scored, if any.
        boxes, table: the instances' boxes and the word table of grounding and CHAIR, when computed.
    Returns:
        ``key:value|key:value...`` (see the module docstring).
    """
    fields = {"refs": references_hash(references), "n": str(len(references)), "tok": tokenizer,
              "impl": _implementation()}
    if decode is not None:
        fields["decode"] = decode_description(decode)
    if checkpoint is not None:
        fields["ckpt"] = file_hash(checkpoint)
    if results is not None:
        fields["results"] = file_hash(results)
    if boxes is not None:
        fields["inst"] = boxes_hash(boxes)
        fields["words"] = words_hash(table if table is not None else COCO_WORDS)
    return "|".join(f"{key}:{value}" for key, value in fields.items())


def parse_signature(signature: str) -> dict[str, str]:
    """``key:value|...`` -> ``{key: value}`` (an empty signature gives ``{}``)."""
    fields = {}
    for part in filter(None, signature.split("|")):
        key, _, value = part.partition(":")
        fields[key] = value
    return fields


def signature_differences(first: str, second: str, ignore: Sequence[str] = SYSTEM_FIELDS) -> list[str]:
    """The fields, other than ``ignore``, where two signatures differ: ``["tok: ptb vs python", ...]``."""
    a, b = parse_signature(first), parse_signature(second)
    keys = [key for key in dict.fromkeys([*a, *b]) if key not in ignore]
    return [f"{key}: {a.get(key, '-')} vs {b.get(key, '-')}" for key in keys if a.get(key) != b.get(key)]
