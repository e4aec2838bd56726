"""A tiny MS-COCO 2014 tree in the published formats, for end-to-end runs of the command-line tools.

``write_coco_tree(root)`` writes what the COCO website and Karpathy's ``caption_datasets.zip`` give:

- ``train2014/COCO_train2014_<12-digit id>.jpg`` and ``val2014/COCO_val2014_<id>.jpg`` (small JPEGs);
- ``dataset_coco.json``: Karpathy's split file (``filepath``, ``filename``, ``imgid``, ``cocoid``,
  ``split`` in train / restval / val / test, ``sentids``, ``sentences`` with ``tokens``, ``raw``,
  ``imgid``, ``sentid``); as in the real file, every train2014 image is ``train`` and the val2014
  images are ``restval``, ``val`` or ``test``;
- ``annotations/captions_{train,val}2014.json`` and ``annotations/instances_{train,val}2014.json``
  in the official formats (``info``, ``licenses``, ``images``, ``annotations``, and ``categories``
  with boxes for the instances files).

The captions are real-looking English sentences about the objects the instances files box.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

# (category id, name, supercategory) as in the official instances files.
CATEGORIES = [
    (1, "person", "person"),
    (3, "car", "vehicle"),
    (6, "bus", "vehicle"),
    (17, "cat", "animal"),
    (18, "dog", "animal"),
    (19, "horse", "animal"),
]
_SENTENCES = {
    "person": [
        "A man standing on a street next to a car.",
        "A woman is walking down the sidewalk.",
        "A person standing in front of a building.",
        "A man in a black jacket on a street.",
        "A young man is standing outside.",
    ],
    "car": [
        "A red car parked on the side of the street.",
        "A car driving down a city street.",
        "A small car parked next to a building.",
        "A car on a road near some trees.",
        "A silver car is parked outside.",
    ],
    "bus": [
        "A large bus driving down a city street.",
        "A red bus parked at a bus stop.",
        "A bus on a street next to a building.",
        "A double decker bus on the road.",
        "A white bus driving down the street.",
    ],
    "cat": [
        "A cat sitting on top of a wooden table.",
        "A black cat laying on a bed.",
        "A cat is sleeping on a couch.",
        "A small cat sitting next to a window.",
        "A cat laying on a blanket.",
    ],
    "dog": [
        "A dog running through a grassy field.",
        "A brown dog laying on the grass.",
        "A dog sitting next to a man on a bench.",
        "A white dog playing with a frisbee.",
        "A dog is standing in the grass.",
    ],
    "horse": [
        "A man riding a horse in a field.",
        "A brown horse standing in a grassy field.",
        "A horse grazing on the grass.",
        "Two horses standing next to a fence.",
        "A horse and a rider on a dirt road.",
    ],
}
# Real COCO 2014 ids; 12 per folder. Of val2014, Karpathy's file puts 4 in each of restval, val and test.
TRAIN_IDS = (9, 25, 30, 34, 36, 49, 61, 64, 71, 72, 77, 78)
VAL_IDS = (42, 73, 74, 133, 136, 139, 143, 164, 192, 196, 208, 241)
KARPATHY_VAL_SPLITS = ("restval",) * 4 + ("val",) * 4 + ("test",) * 4
IMAGE_SIZE = (48, 40)  # (width, height) of every image


@dataclass(frozen=True)
class CocoTree:
    """The files ``write_coco_tree`` wrote (all under ``root``)."""

    root: Path
    split_file: Path
    captions: dict[str, Path]  # "train2014" / "val2014" -> captions_<folder>.json
    instances: dict[str, Path]  # "train2014" / "val2014" -> instances_<folder>.json


def _category_of(image_id: int) -> tuple[int, str]:
    category_id, name, _ = CATEGORIES[image_id % len(CATEGORIES)]
    return category_id, name


def _write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _official_image(folder: str, image_id: int) -> dict:
    width, height = IMAGE_SIZE
    return {
        "license": 3,
        "file_name": f"COCO_{folder}_{image_id:012d}.jpg",
        "coco_url": f"http://images.cocodataset.org/{folder}/COCO_{folder}_{image_id:012d}.jpg",
        "height": height,
        "width": width,
        "date_captured": "2013-11-14 11:18:45",
        "flickr_url": "http://farm3.staticflickr.com/2.jpg",
        "id": image_id,
    }


def _info() -> dict:
    return {
        "description": "COCO 2014 Dataset",
        "url": "http://cocodataset.org",
        "version": "1.0",
        "year": 2014,
        "contributor": "COCO Consortium",
        "date_created": "2017/09/01",
    }


def write_coco_tree(root: str | Path) -> CocoTree:
    """Write the tiny COCO 2014 tree under ``root`` (see the module docstring) and return its paths."""
    root = Path(root)
    rng = np.random.default_rng(0)
    folders = {"train2014": TRAIN_IDS, "val2014": VAL_IDS}
    karpathy_images, captions, instances = [], {}, {}
    sentence_id = annotation_id = 0
    for folder, ids in folders.items():
        images, caption_annotations, boxes = [], [], []
        for position, image_id in enumerate(ids):
            image = _official_image(folder, image_id)
            pixels = rng.integers(0, 256, (IMAGE_SIZE[1], IMAGE_SIZE[0], 3), dtype=np.uint8)
            (root / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / folder / image["file_name"], quality=90)
            images.append(image)
            category_id, name = _category_of(image_id)
            sentences = []
            for raw in _SENTENCES[name]:
                annotation_id += 1
                caption_annotations.append({"image_id": image_id, "id": annotation_id, "caption": raw})
                tokens = raw.lower().rstrip(".").split()
                sentences.append(
                    {"tokens": tokens, "raw": raw, "imgid": len(karpathy_images), "sentid": sentence_id}
                )
                sentence_id += 1
            x, y = int(rng.integers(0, 16)), int(rng.integers(0, 12))
            boxes.append(
                {
                    "segmentation": [[x, y, x + 20, y, x + 20, y + 20, x, y + 20]],
                    "area": 400.0,
                    "iscrowd": 0,
                    "image_id": image_id,
                    "bbox": [float(x), float(y), 20.0, 20.0],
                    "category_id": category_id,
                    "id": 900000 + annotation_id,
                }
            )
            split = "train" if folder == "train2014" else KARPATHY_VAL_SPLITS[position]
            karpathy_images.append(
                {
                    "filepath": folder,
                    "sentids": [s["sentid"] for s in sentences],
                    "filename": image["file_name"],
                    "imgid": len(karpathy_images),
                    "split": split,
                    "sentences": sentences,
                    "cocoid": image_id,
                }
            )
        licenses = [
            {
                "url": "http://creativecommons.org/licenses/by-nc-sa/2.0/",
                "id": 3,
                "name": "Attribution-NonCommercial-ShareAlike License",
            }
        ]
        captions[folder] = _write_json(
            root / "annotations" / f"captions_{folder}.json",
            {"info": _info(), "images": images, "licenses": licenses, "annotations": caption_annotations},
        )
        instances[folder] = _write_json(
            root / "annotations" / f"instances_{folder}.json",
            {
                "info": _info(),
                "images": images,
                "licenses": licenses,
                "annotations": boxes,
                "categories": [
                    {"supercategory": sup, "id": cid, "name": name} for cid, name, sup in CATEGORIES
                ],
            },
        )
    split_file = _write_json(root / "dataset_coco.json", {"images": karpathy_images, "dataset": "coco"})
    return CocoTree(root, split_file, captions, instances)
