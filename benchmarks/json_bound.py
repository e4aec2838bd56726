"""What the JSON reader's nesting bound costs, as a share of the parse it guards.

    python benchmarks/json_bound.py                 # a COCO-instances-like file of about 120 MB
    python benchmarks/json_bound.py --file data/coco/annotations/instances_val2014.json

Without ``--file`` it writes, in a temporary folder, a file shaped like COCO's instances files
(annotations with boxes and segmentation polygons, images with file names and URLs) and one shaped
like Karpathy's split (many short strings). For each it times ``json.loads`` of the decoded text and
the bound (``json_files._too_deep``) alternately, ``--repeats`` times each, and keeps each side's
minimum (a busy machine moves single timings by more than the ratio measured here).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from captioning.utils.json_files import _too_deep


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--file", type=Path, action="append", help="a JSON file to time (repeatable)")
    parser.add_argument("--scale", type=float, default=1.0, help="size of the written files (1: ~120 MB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each side (5; minimum kept)")
    return parser


def write_instances_like(path: Path, scale: float) -> None:
    """Annotations with a box and a polygon of 10 to 80 points, and the images' records."""
    rng = random.Random(0)
    annotations = [
        {
            "id": i,
            "image_id": i // 7,
            "category_id": rng.randint(1, 90),
            "area": rng.random() * 1e4,
            "iscrowd": 0,
            "bbox": [round(rng.random() * 600, 2) for _ in range(4)],
            "segmentation": [[round(rng.random() * 600, 2) for _ in range(rng.randint(10, 80))]],
        }
        for i in range(int(200_000 * scale))
    ]
    images = [
        {
            "id": i,
            "file_name": f"COCO_val2014_{i:012d}.jpg",
            "height": 480,
            "width": 640,
            "coco_url": "http://x/y.jpg",
        }
        for i in range(int(30_000 * scale))
    ]
    path.write_text(json.dumps({"images": images, "annotations": annotations}), encoding="utf-8")


def write_karpathy_like(path: Path, scale: float) -> None:
    """Five captions of ten words per image, one in a hundred quoting something."""
    rng = random.Random(0)
    words = "a man riding wave on top of surfboard the dog cat".split()
    images = []
    for i in range(int(60_000 * scale)):
        sentences = []
        for j in range(5):
            tokens = [rng.choice(words) for _ in range(10)]
            if rng.random() < 0.01:  # a caption quoting a sign now and then: escaped quotes in the file
                tokens.append('"stop"')
            sentences.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": i, "sentid": 5 * i + j})
        images.append(
            {"filename": f"COCO_val2014_{i:012d}.jpg", "imgid": i, "split": "train", "sentences": sentences}
        )
    path.write_text(json.dumps({"images": images, "dataset": "coco"}), encoding="utf-8")


def alternate_minimums(
    first: Callable[[], object], second: Callable[[], object], repeats: int
) -> tuple[float, float]:
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for side, run in enumerate((first, second)):
            start = time.perf_counter()
            run()
            best[side] = min(best[side], time.perf_counter() - start)
    return best[0], best[1]


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        files = list(args.file or [])
        if not files:
            files = [Path(folder) / "instances_like.json", Path(folder) / "karpathy_like.json"]
            write_instances_like(files[0], args.scale)
            write_karpathy_like(files[1], args.scale)
        print(f"{'file':<28} {'MB':>7} {'parse s':>8} {'bound s':>8} {'bound/parse':>11}")
        for path in files:
            data = path.read_bytes()
            text = data.decode("utf-8")
            parse, bound = alternate_minimums(
                lambda text=text: json.loads(text), lambda data=data: _too_deep(data), args.repeats
            )
            print(f"{path.name:<28} {len(data) / 1e6:7.1f} {parse:8.3g} {bound:8.3g} {bound / parse:11.1%}")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
