"""Reading COCO-format files for scoring: reference captions (annotation JSON) and results JSON.

Every malformed entry is refused with one line naming the file and the entry, before any scoring.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO

from captioning.utils.errors import CaptioningError
from captioning.utils.json_files import JsonError, read_json_file


class EvaluationInputError(CaptioningError, ValueError):
    """References, candidates or an annotation/results file are malformed."""


def _check_entries(
    path: str | Path, list_key: str, entries: list, entry_keys: Sequence[str], plain_values: bool
) -> None:
    """Every entry of ``entries`` is an object holding ``entry_keys`` (with ``plain_values``: each an
    integer or a string, as pycocotools' index keys them); else one line naming the file and entry."""
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise EvaluationInputError(f"{path}: {list_key}[{index}] is not an object")
        for key in entry_keys:
            if key not in entry:
                raise EvaluationInputError(f"{path}: {list_key}[{index}] has no {key!r}")
            if plain_values and isinstance(entry[key], (dict, list)):
                raise EvaluationInputError(
                    f"{path}: {list_key}[{index}]: {key} must be an integer or a string"
                )


def read_coco_file(path: str | Path, required: Mapping[str, Sequence[str]]) -> COCO:
    """Read a COCO-format JSON file into a pycocotools ``COCO`` index, with one-line errors.

    Args:
        path: the JSON file.
        required: top-level list key -> keys every entry of that list must have, e.g.
            ``{"annotations": ["image_id", "caption"]}``.
    Raises:
        EvaluationInputError: missing file, not JSON, not an object, a missing list or entry key,
            a repeated image or annotation id.
    """
    data = read_json(path)
    if not isinstance(data, dict):
        raise EvaluationInputError(f"{path}: expected a COCO JSON object, got {type(data).__name__}")
    for list_key, entry_keys in required.items():
        if not isinstance(data.get(list_key), list):
            raise EvaluationInputError(f"{path}: missing the list {list_key!r}")
        _check_entries(path, list_key, data[list_key], entry_keys, plain_values=False)
    # What pycocotools' index reads of every entry, given the lists: each image's and category's id, and
    # each annotation's category when there are categories (else a KeyError or TypeError inside it).
    needed = {"images": ["id"], "categories": ["id"]}
    if "categories" in data:
        needed["annotations"] = ["category_id"]
    for list_key, entry_keys in needed.items():
        if list_key not in data:
            continue
        entries = data[list_key]
        if not isinstance(entries, list):
            raise EvaluationInputError(f"{path}: {list_key!r} must be a list, got {type(entries).__name__}")
        _check_entries(path, list_key, entries, entry_keys, plain_values=True)
    for list_key in ("images", "annotations"):  # a repeated id would silently replace an entry in the index
        first_index: dict[Any, int] = {}
        for index, entry in enumerate(data.get(list_key) or []):
            if isinstance(entry, dict) and "id" in entry:
                entry_id = entry["id"]
                if not isinstance(entry_id, (int, str)) or isinstance(entry_id, bool):
                    raise EvaluationInputError(
                        f"{path}: {list_key}[{index}]: id must be an integer or a "
                        f"string, got {entry_id!r:.60}"
                    )
                if entry_id in first_index:
                    raise EvaluationInputError(
                        f"{path}: {list_key}[{index}]: duplicate id {entry_id!r} "
                        f"(also {list_key}[{first_index[entry_id]}])"
                    )
                first_index[entry_id] = index
    annotations = [a for a in data.get("annotations") or [] if isinstance(a, dict)]
    free_id = 1 + max((a["id"] for a in annotations if isinstance(a.get("id"), int)), default=0)
    for annotation in annotations:
        if "id" not in annotation:  # caption files may omit ids; the COCO index needs unique ones
            annotation["id"], free_id = free_id, free_id + 1
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def load_coco_references(annotation_file: str | Path) -> dict[int, list[str]]:
    """Reference captions from a COCO captions file (``annotations`` with ``image_id`` and ``caption``).

    Returns:
        image id -> its captions, for every image that has at least one.
    """
    coco = read_coco_file(annotation_file, {"annotations": ["image_id", "caption"]})
    for index, annotation in enumerate(coco.dataset["annotations"]):
        image_id = annotation["image_id"]
        if isinstance(image_id, bool) or not isinstance(image_id, int):  # would match no result: dropped
            raise EvaluationInputError(
                f"{annotation_file}: annotations[{index}]: image_id must be an integer, got {image_id!r:.60}"
            )
    references: dict[int, list[str]] = {}
    for image_id, image_annotations in coco.imgToAnns.items():
        captions = [annotation["caption"] for annotation in image_annotations]
        if not all(isinstance(caption, str) for caption in captions):
            raise EvaluationInputError(f"{annotation_file}: image {image_id}: a caption is not a string")
        references[image_id] = captions
    return references


def load_results(results_file: str | Path) -> dict[int, str]:
    """Candidate captions from a COCO results file ``[{"image_id": int, "caption": str}, ...]``.

    Raises:
        EvaluationInputError: one line naming the file and entry: not JSON, not a list, a missing
            key, a non-integer id, a non-string caption, a repeated image id.
    """
    data = read_json(results_file)
    if not isinstance(data, list):
        raise EvaluationInputError(f"{results_file}: expected a list of results, got {type(data).__name__}")
    results: dict[int, str] = {}
    for index, entry in enumerate(data):
        where = f"{results_file}: entry {index}"
        if not isinstance(entry, dict):
            raise EvaluationInputError(f"{where} is not an object")
        for key in ("image_id", "caption"):
            if key not in entry:
                raise EvaluationInputError(f"{where} has no {key!r}")
        image_id, caption = entry["image_id"], entry["caption"]
        if isinstance(image_id, bool) or not isinstance(image_id, int):
            raise EvaluationInputError(f"{where}: image_id must be an integer, got {image_id!r}")
        if not isinstance(caption, str):
            raise EvaluationInputError(f"{where}: caption must be a string, got {caption!r}")
        if image_id in results:
            raise EvaluationInputError(f"{where}: image_id {image_id} appears twice")
        results[image_id] = caption
    return results


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``.

    Raises:
        EvaluationInputError: one line naming the file: missing, not a regular file, not JSON, or
            nested too deeply.
    """
    try:
        return read_json_file(path)  # the project's one JSON reader: a regular file, bounded
    except FileNotFoundError:
        raise EvaluationInputError(f"{path}: no such file") from None
    except JsonError as error:
        raise EvaluationInputError(str(error)) from None


__all__ = ["EvaluationInputError", "load_coco_references", "load_results", "read_coco_file", "read_json"]
