"""The published pointing game (Zhang et al. 2016, as TorchRay's benchmark computes it) beside the
strict one: a tolerance in pixels around the upsampled map's maximum, masks where the instances file
has segmentations, and the mean over classes beside the mean over mentions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from messages import raises_naming
from pycocotools import mask as mask_utils

from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.grounding import WordMatcher, grounding_scores, load_instances
from captioning.evaluation.pointing import map_maximum, object_mask, published_hit
from captioning.evaluation.ratios import aligned_classes, class_statistics
from captioning.evaluation.significance import class_mean_score

SIDE = 100  # image side in pixels; the attention grid has one cell per pixel unless said otherwise


def write_instances(path: Path, annotations: list[dict], images: int = 1) -> Path:
    path.write_text(
        json.dumps(
            {
                "images": [{"id": i, "width": SIDE, "height": SIDE} for i in range(1, images + 1)],
                "categories": [{"id": 1, "name": "dog"}, {"id": 2, "name": "cat"}],
                "annotations": [{"id": n, "iscrowd": 0, **a} for n, a in enumerate(annotations)],
            }
        )
    )
    return path


def pixel_map(x: int, y: int, side: int = SIDE) -> np.ndarray:
    """A (side, side) map whose maximum is pixel (x, y); smaller elsewhere, not flat."""
    weights = np.full((side, side), 1.0)
    weights[y, x] = 5.0
    return weights / weights.sum()


def scores_of(instances_file: Path, items: list[tuple[int, list[str], np.ndarray]], grid: int = SIDE) -> dict:
    instances = load_instances(instances_file)
    return grounding_scores(
        [(image_id, words, maps, (grid, grid)) for image_id, words, maps in items], instances, WordMatcher()
    )


# a dog box spanning x, y in [40, 60]
BOX = {"image_id": 1, "category_id": 1, "bbox": [40.0, 40.0, 20.0, 20.0]}


@pytest.mark.parametrize(
    ("x", "strict", "published"),
    [(50, 1.0, 1.0), (69, 0.0, 1.0), (79, 0.0, 0.0)],  # inside; 10 px right of the edge; 20 px right
)
def test_a_maximum_10_px_outside_hits_only_the_published_game_and_20_px_misses_both(
    tmp_path, x, strict, published
):
    # The box's last column of pixels is 59 (it covers [40, 60)); x = 69 is 10 px from it, 79 is 20 px.
    result = scores_of(write_instances(tmp_path / "i.json", [BOX]), [(1, ["dog"], pixel_map(x, 50)[None])])
    assert result["grounding-pointing"] == strict
    assert result["grounding-pointing-published"] == published
    assert result["grounding-pointing-published-mentioned-classes"] == published
    assert result["grounding-pointing-published-classes"] == published / 2  # cat, never named, counts 0


def test_the_tolerance_is_an_option_and_strictly_inside():
    mask = np.zeros((SIDE, SIDE), dtype=bool)
    mask[50, 59] = True
    weights = pixel_map(69, 50)  # exactly 10 px from the one mask pixel
    assert published_hit(weights, mask, (SIDE, SIDE), tolerance=15)
    assert published_hit(weights, mask, (SIDE, SIDE), tolerance=10.5)
    assert not published_hit(weights, mask, (SIDE, SIDE), tolerance=10)


def test_the_segmentation_mask_not_the_box_is_the_ground_truth(tmp_path):
    # A thin triangle in the box's left part: its box is [10, 90] wide, but the mask ends near x = 30.
    triangle = [10.0, 10.0, 30.0, 10.0, 10.0, 90.0]
    dog = {"image_id": 1, "category_id": 1, "bbox": [10.0, 10.0, 80.0, 80.0], "segmentation": [triangle]}
    result = scores_of(write_instances(tmp_path / "i.json", [dog]), [(1, ["dog"], pixel_map(70, 70)[None])])
    assert result["grounding-pointing"] == 1.0  # the strict rule reads boxes: (70.5, 70.5) is inside
    assert result["grounding-pointing-published"] == 0.0  # 40+ px from the triangle
    near = scores_of(write_instances(tmp_path / "j.json", [dog]), [(1, ["dog"], pixel_map(25, 25)[None])])
    assert near["grounding-pointing-published"] == 1.0


def test_rle_segmentations_compressed_or_not_decode_to_their_mask(tmp_path):
    truth = np.zeros((SIDE, SIDE), dtype=np.uint8, order="F")
    truth[20:35, 60:90] = 1
    truth[70, 5] = 1
    compressed = mask_utils.encode(truth)
    compressed = {"size": compressed["size"], "counts": compressed["counts"].decode("ascii")}
    runs, value, count = [], 0, 0  # the uncompressed RLE: column-major runs starting with zeros
    for bit in truth.ravel(order="F"):
        if bit != value:
            runs.append(count)
            value, count = bit, 0
        count += 1
    runs.append(count)
    uncompressed = {"size": [SIDE, SIDE], "counts": [int(v) for v in runs]}
    annotations = [
        {"image_id": 1, "category_id": 1, "bbox": [5.0, 20.0, 85.0, 51.0], "segmentation": compressed},
        {"image_id": 1, "category_id": 2, "bbox": [5.0, 20.0, 85.0, 51.0], "segmentation": uncompressed},
    ]
    instances = load_instances(write_instances(tmp_path / "i.json", annotations))
    for obj in instances.objects[1]:
        assert (object_mask(obj.bbox, obj.segmentation, (SIDE, SIDE)) == truth.astype(bool)).all()


@pytest.mark.parametrize(
    ("segmentation", "names"),
    [
        ([[1.0, 2.0, 3.0]], ("segmentation[0]", "polygon", "[1.0, 2.0, 3.0]")),
        ({"size": [SIDE, SIDE], "counts": [5, 3]}, ("segmentation", "RLE", "[5, 3]")),  # too short
        (
            {"size": [SIDE, SIDE], "counts": [SIDE * SIDE + 7]},
            ("segmentation", "RLE", f"[{SIDE * SIDE + 7}]"),
        ),
        ({"size": [10, 10], "counts": [100]}, ("segmentation", f"[{SIDE}, {SIDE}]", "[10, 10]")),
        ({"size": [SIDE, SIDE], "counts": "\x7f\x7f"}, ("segmentation", "RLE")),
    ],
)
def test_a_bad_segmentation_is_one_line_naming_the_file_and_entry(tmp_path, segmentation, names):
    # Runs that do not cover the image exactly would make pycocotools write past its buffer.
    path = write_instances(tmp_path / "i.json", [{**BOX, "segmentation": segmentation}])
    with raises_naming(EvaluationInputError, f"{path}: annotations[0]", *names):
        load_instances(path)


def test_the_class_mean_differs_from_the_mention_mean(tmp_path):
    # Two dog mentions hit (two images), one cat mention misses: 2/3 per mention, (1 + 0) / 2 per class.
    annotations = [
        {"image_id": 1, "category_id": 1, "bbox": [40.0, 40.0, 20.0, 20.0]},
        {"image_id": 2, "category_id": 1, "bbox": [40.0, 40.0, 20.0, 20.0]},
        {"image_id": 2, "category_id": 2, "bbox": [0.0, 0.0, 10.0, 10.0]},
    ]
    on_dog = pixel_map(50, 50)
    items = [(1, ["dog"], on_dog[None]), (2, ["dog", "cat"], np.stack([on_dog, on_dog]))]
    result = scores_of(write_instances(tmp_path / "i.json", annotations, images=2), items)
    assert result["grounding-words"] == 3
    assert result["grounding-pointing-published"] == pytest.approx(2 / 3)
    assert result["grounding-pointing-published-classes"] == pytest.approx(0.5)
    assert result["grounding-pointing-published-mentioned-classes"] == pytest.approx(0.5)


class TorchRayPointingGame:
    """TorchRay's ``PointingGame`` counters written out: per class hits and misses, accuracy the mean
    over all ``num_classes`` of hits / max(hits + misses, 1)."""

    def __init__(self, num_classes: int):
        self.hits, self.misses = [0.0] * num_classes, [0.0] * num_classes

    def aggregate(self, hit: bool, class_id: int) -> None:
        if hit:
            self.hits[class_id] += 1
        else:
            self.misses[class_id] += 1

    @property
    def accuracy(self) -> float:
        rates = [h / max(h + m, 1) for h, m in zip(self.hits, self.misses, strict=True)]
        return sum(rates) / len(rates)


def test_the_class_mean_counts_a_category_never_named_as_0_as_torchray_does(tmp_path):
    # dog hit twice, cat missed once, bird (in the file's categories) never named: TorchRay's mean is
    # (1 + 0 + 0) / 3; the mean over the classes named is (1 + 0) / 2.
    annotations = [
        {"image_id": 1, "category_id": 1, "bbox": [40.0, 40.0, 20.0, 20.0]},
        {"image_id": 2, "category_id": 1, "bbox": [40.0, 40.0, 20.0, 20.0]},
        {"image_id": 2, "category_id": 2, "bbox": [0.0, 0.0, 10.0, 10.0]},
        {"image_id": 2, "category_id": 3, "bbox": [80.0, 80.0, 10.0, 10.0]},
    ]
    path = write_instances(tmp_path / "i.json", annotations, images=2)
    data = json.loads(path.read_text())
    data["categories"].append({"id": 3, "name": "bird"})
    path.write_text(json.dumps(data))
    on_dog = pixel_map(50, 50)
    result = scores_of(path, [(1, ["dog"], on_dog[None]), (2, ["dog", "cat"], np.stack([on_dog, on_dog]))])
    game = TorchRayPointingGame(3)  # dog 0, cat 1, bird 2
    for hit, class_id in [(True, 0), (True, 0), (False, 1)]:
        game.aggregate(hit, class_id)
    assert result["grounding-pointing-published-classes"] == pytest.approx(game.accuracy)
    assert game.accuracy == pytest.approx(1 / 3)
    assert result["grounding-pointing-published-mentioned-classes"] == pytest.approx(0.5)


def test_a_coarse_map_is_upsampled_to_the_image_before_its_maximum_is_taken():
    weights = np.zeros((4, 4))
    weights[1, 2] = 1.0  # cell (1, 2) of a 4x4 grid on 64x64: pixels x in [32, 48), y in [16, 32)
    x, y = map_maximum(weights, (64.0, 64.0))
    assert (x, y) == (39, 23)  # bilinear, centres aligned: the peak is the cell's centre (39.5, 23.5)
    # a point 10 px right of a box that ends at pixel 29 hits within 15 px, and misses within 10
    mask = np.zeros((64, 64), dtype=bool)
    mask[23, 20:30] = True
    assert published_hit(weights, mask, (64.0, 64.0), 15) and not published_hit(
        weights, mask, (64.0, 64.0), 10
    )


def test_the_class_mean_is_bootstrapped_over_one_class_list_and_a_malformed_entry_is_one_line():
    a = class_statistics(
        [
            {"image_id": 1, "grounding-classes": {"dog": [1, 1]}},
            {"image_id": 2, "grounding-classes": {"cat": [0, 2]}},
        ],
        [1, 2],
        "a.json",
    )
    b = class_statistics(
        [{"image_id": 1, "grounding-classes": {"dog": [1, 2]}}, {"image_id": 2}], [1, 2], "b.json"
    )
    first, second = aligned_classes([a, b])  # classes cat, dog: (N, 4) each
    assert first.tolist() == [[0, 0, 1, 1], [0, 2, 0, 0]] and second.tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]
    assert class_mean_score(np.stack([first.sum(0), second.sum(0)])).tolist() == [0.5, 0.5]
    assert aligned_classes([a, {}]) == []  # scores written before the published game: not compared
    with raises_naming(EvaluationInputError, "c.json", "image_id 1", "grounding-classes"):
        class_statistics([{"image_id": 1, "grounding-classes": {"dog": 3}}], [1], "c.json")
