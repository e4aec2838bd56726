"""Where a method's map points at a hallucinated mention: at the wrong object, at the object of the
class the hallucinated one co-occurs with, or nowhere.

A mention is hallucinated as CHAIR has it (:func:`captioning.explain.plausibility.mention_rows`: its
category is neither among the image's annotated objects nor named by its references). Its map's peak
is the cell with the largest value (the first of equal ones); the peak lands on the object whose box
holds the cell's centre (the smallest such box, as an object tucked under a larger one has its box
inside the larger one's), and is

- ``co_occurring``: on an object of the class the hallucinated class co-occurs with
  (:func:`co_occurring_classes`): the model looked at what its prior ties the word to;
- ``wrong_object``: on an object of another class (which class is counted);
- ``nowhere``: on no object's box, or the map has no positive value (it points at nothing).

The grounded mentions' maps are counted by the same rule as the baseline (``grounded``): on an object
of the named class (``named_object``), on another object (``other_object``), or ``nowhere``; a small
object on a coarse grid often has no cell centre in its box, so ``nowhere`` reads against them.

The classes come from the instances file: for each category ``c``, the category ``d`` that maximises
``P(c in the image | d in the image)`` over the file's images, among the categories in at least
``MIN_IMAGES`` images: on the hallucination testbed (``data.dataset=shapes_hallucination``) the square's
is the circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.sparse import csr_array

from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.explain.plausibility import Explained

PEAK_KINDS = ("co_occurring", "wrong_object", "nowhere")
GROUNDED_KINDS = ("named_object", "other_object", "nowhere")
MIN_IMAGES = 10  # a class in fewer images gives no reliable co-occurrence


def co_occurring_classes(instances: Instances, min_images: int = MIN_IMAGES) -> dict[str, str]:
    """Category -> the category it most probably appears beside (see the module); a category with
    no other category in ``min_images`` images or more has none. Ties go to the larger count of images
    together, then to the first name in order.

    The counts come from one sparse product of the (images, categories) presence matrix with itself,
    so the cost grows with the pairs of categories that share an image, not with categories squared
    times images."""
    present = [{obj.category for obj in objects} for objects in instances.objects.values()]
    categories = sorted(set().union(*present)) if present else []
    if not categories:
        return {}
    column = {name: index for index, name in enumerate(categories)}
    rows = [image for image, classes in enumerate(present) for _ in classes]
    columns = [column[name] for classes in present for name in classes]
    incidence = csr_array(
        (np.ones(len(rows), dtype=np.int64), (rows, columns)), shape=(len(present), len(categories))
    )  # (N, C): 1 where the image holds the category
    together = (incidence.T @ incidence).tocsr()  # (C, C): images holding both (the diagonal: each one's)
    holding = together.diagonal()  # (C,) images holding each category
    partners: dict[str, str] = {}
    for c in range(len(categories)):
        start, end = together.indptr[c], together.indptr[c + 1]
        others, counts = together.indices[start:end], together.data[start:end]
        keep = (others != c) & (holding[others] >= min_images) & (counts > 0)
        if not keep.any():
            continue
        others, counts = others[keep], counts[keep]
        ratio = counts / holding[others]  # P(c in the image | d in the image) for each d
        best = np.lexsort((others, -counts, -ratio))[0]  # the largest ratio, then count, then first name
        partners[categories[c]] = categories[int(others[best])]
    return partners


def peak_object(
    weights: np.ndarray, objects: Sequence[ObjectBox], image_size: tuple[float, float], grid: tuple[int, int]
) -> ObjectBox | None:
    """The object the map's peak lands on, or None (no positive value, or the peak on no object's box).

    Args:
        weights: (P,) one word's map over the grid's cells, row-major.
        objects: the image's objects.
        image_size: (width, height) in pixels.
        grid: (gh, gw), P = gh * gw.
    """
    values = np.asarray(weights, dtype=np.float64).ravel()
    if not values.size or values.max() <= 0:
        return None
    row, col = divmod(int(values.argmax()), grid[1])
    x = (col + 0.5) * image_size[0] / grid[1]
    y = (row + 0.5) * image_size[1] / grid[0]
    holding = [
        obj
        for obj in objects
        if obj.bbox[0] <= x <= obj.bbox[0] + obj.bbox[2] and obj.bbox[1] <= y <= obj.bbox[1] + obj.bbox[3]
    ]
    return min(holding, key=lambda obj: obj.bbox[2] * obj.bbox[3]) if holding else None


def peak_kind(target: ObjectBox | None, category: str, partners: Mapping[str, str]) -> str:
    """One of :data:`PEAK_KINDS` for a hallucinated mention of ``category`` whose peak is on ``target``."""
    if target is None:
        return "nowhere"
    return "co_occurring" if partners.get(category) == target.category else "wrong_object"


def hallucination_peaks(
    explained: Sequence[Explained],
    instances: Instances,
    rows: Sequence[Mapping],
    methods: Sequence[str],
    partners: Mapping[str, str] | None = None,
) -> dict:
    """Per method, where its maps peak at the hallucinated mentions of ``rows``.

    Args:
        explained: the images' maps (``Explained.maps[method]`` (T, P)).
        instances: the objects and image sizes.
        rows: :func:`captioning.explain.plausibility.mention_rows` of ``explained``.
        methods: the methods to count.
        partners: category -> its co-occurring class; None: :func:`co_occurring_classes` of ``instances``.
    Returns:
        ``{"co_occurring_classes": {category: class}, "methods": {method: {"mentions", "co_occurring",
        "wrong_object", "nowhere", "wrong_object_classes": {class: count}, "grounded": {"mentions",
        "named_object", "other_object", "nowhere"}}}}``.
    """
    partners = co_occurring_classes(instances) if partners is None else dict(partners)
    by_image = {item.image_id: item for item in explained}
    counts: dict[str, dict] = {
        method: {
            "mentions": 0,
            **{kind: 0 for kind in PEAK_KINDS},
            "wrong_object_classes": {},
            "grounded": {"mentions": 0, **{kind: 0 for kind in GROUNDED_KINDS}},
        }
        for method in methods
    }
    for row in rows:
        item = by_image[row["image_id"]]
        objects = instances.objects.get(item.image_id, [])
        for method in methods:
            target = peak_object(
                item.maps[method][row["word"]], objects, instances.image_sizes[item.image_id], item.grid
            )
            if not row["hallucinated"]:
                grounded = counts[method]["grounded"]
                grounded["mentions"] += 1
                named = target is not None and target.category == row["category"]
                grounded["nowhere" if target is None else "named_object" if named else "other_object"] += 1
                continue
            kind = peak_kind(target, row["category"], partners)
            entry = counts[method]
            entry["mentions"] += 1
            entry[kind] += 1
            if kind == "wrong_object" and target is not None:
                entry["wrong_object_classes"][target.category] = (
                    entry["wrong_object_classes"].get(target.category, 0) + 1
                )
    used = {row["category"] for row in rows if row["hallucinated"]}
    return {
        "co_occurring_classes": {c: partners[c] for c in sorted(used) if c in partners},
        "methods": counts,
    }


def peak_lines(peaks: Mapping) -> list[str]:
    """The counts as console lines (none when no mention was hallucinated)."""
    methods = peaks.get("methods", {})
    if not any(entry["mentions"] for entry in methods.values()):
        return []
    pairs = ", ".join(f"{c} beside {d}" for c, d in peaks.get("co_occurring_classes", {}).items()) or "none"
    lines = [f"where the maps peak at hallucinated mentions (co-occurring classes: {pairs})"]
    for method, entry in methods.items():
        which = ", ".join(f"{c} {n}" for c, n in sorted(entry["wrong_object_classes"].items()))
        lines.append(
            f"  {method:<22} of {entry['mentions']}: co-occurring object {entry['co_occurring']}, wrong "
            f"object {entry['wrong_object']}{f' ({which})' if which else ''}, nowhere {entry['nowhere']}"
            + _grounded_clause(entry.get("grounded", {}))
        )
    return lines


def _grounded_clause(grounded: Mapping) -> str:
    """``"; grounded mentions: of 91, on their object 60, ..."`` (or "" without grounded mentions)."""
    if not grounded.get("mentions"):
        return ""
    return (
        f"; grounded: of {grounded['mentions']}, on their object {grounded['named_object']}, "
        f"another {grounded['other_object']}, nowhere {grounded['nowhere']}"
    )
