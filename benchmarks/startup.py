"""Start-up cost of COCO-sized caption files: the readers alone, the first start, warm starts.

Writes, in a temporary folder (or ``--folder``), a synthetic ``dataset_coco.json`` of COCO's size
(123,287 images: 113,287 train/restval, 5,000 val, 5,000 test; 5 captions each, drawn from real
human captions) and the official-format ``captions_train2014.json`` / ``captions_val2014.json``
over the same images, then measures, each in a fresh process (wall time, CPU time of the process,
which other processes on a busy machine inflate much less, and peak resident memory):

- ``plain``: the reader alone, what every start cost before the dataset index;
- ``first``: ``load_records`` of a training run with no index yet (reads, tokenizes, writes the index);
- ``warm``: the same with the index (a training start: every split);
- ``warm_split``: one split from the index, as ``evaluate.py`` / ``visualize.py --split test`` read it
  (Karpathy's test split; the official files have none, so their val split).

Peak memory is the process's high-water resident size (``VmHWM``), with what the imports alone
take beside it.

    python benchmarks/startup.py            # a table (minutes on 2 cores: COCO is tokenized twice)
    python benchmarks/startup.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL_CAPTIONS = Path("/work/shared/data/flickr_test_captions.json")  # Flickr8k/30k test references
SPLITS = (("train", 82_783), ("restval", 30_504), ("val", 5_000), ("test", 5_000))  # Karpathy's COCO split
CAPTIONS_PER_IMAGE = 5

_MEASURE = """
import json, logging, sys, time
logging.disable(logging.WARNING)
from captioning.config import CocoDataConfig, KarpathyDataConfig
from captioning.data import load_records
from captioning.data.coco import read_coco
from captioning.data.karpathy import read_karpathy

folder, dataset, mode = sys.argv[1], sys.argv[2], sys.argv[3]
annotations = (f"{folder}/captions_train2014.json", f"{folder}/captions_val2014.json")
paths = dict(root=f"{folder}/images", cache_dir=f"{folder}/cache_{dataset}")
config = (KarpathyDataConfig(split_file=f"{folder}/dataset_coco.json", **paths) if dataset == "karpathy"
          else CocoDataConfig(annotations=annotations, **paths))
def peak_mib():  # this process's high-water resident size (ru_maxrss would count the forking parent's)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024

base = peak_mib()
start, cpu_start = time.perf_counter(), time.process_time()
if mode == "plain":
    records = (read_karpathy(f"{folder}/dataset_coco.json", config.root) if dataset == "karpathy"
               else read_coco(annotations, config.root))
elif mode == "warm_split":
    records = load_records(config, splits=("test" if dataset == "karpathy" else "val",))
else:
    records = load_records(config, output_dir=f"{folder}/run")
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mb": peak_mib(), "imports_mb": base,
                  "images": len(records), "captions": sum(len(r.raw) for r in records)}))
"""


def _caption_pool(path: Path) -> list[str]:
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))["datasets"]
        return [caption for images in data.values() for image in images for caption in image["captions"]]
    rng = random.Random(0)  # no real captions here: templated ones of the same length (~11 words)
    nouns, verbs = (
        ["man", "woman", "dog", "bus", "table", "pizza", "cat", "train"],
        ["sits", "runs", "stands"],
    )
    return [
        f"A {rng.choice(nouns)} {rng.choice(verbs)} next to a {rng.choice(nouns)} "
        f"on the {rng.choice(nouns)} ."
        for _ in range(10_000)
    ]


def write_dataset(folder: Path, pool: list[str]) -> None:
    """dataset_coco.json and captions_{train,val}2014.json over the same 123,287 synthetic images."""
    rng = random.Random(0)
    images, official = [], {"train2014": ([], []), "val2014": ([], [])}
    cocoid, sentid = 1, 0
    for split, count in SPLITS:
        coco_folder = "train2014" if split == "train" else "val2014"
        for _ in range(count):
            name = f"COCO_{coco_folder}_{cocoid:012d}.jpg"
            raws = rng.sample(pool, CAPTIONS_PER_IMAGE)
            sentences = [
                {
                    "tokens": re.findall(r"[a-z0-9']+", raw.lower()),
                    "raw": raw,
                    "imgid": len(images),
                    "sentid": sentid + k,
                }
                for k, raw in enumerate(raws)
            ]
            images.append(
                {
                    "filepath": coco_folder,
                    "filename": name,
                    "imgid": len(images),
                    "split": split,
                    "cocoid": cocoid,
                    "sentids": [s["sentid"] for s in sentences],
                    "sentences": sentences,
                }
            )
            entries, annotations = official[coco_folder]
            entries.append({"id": cocoid, "file_name": name, "width": 640, "height": 480})
            annotations.extend(
                {"id": sentid + k, "image_id": cocoid, "caption": raw} for k, raw in enumerate(raws)
            )
            cocoid += 1
            sentid += CAPTIONS_PER_IMAGE
    (folder / "dataset_coco.json").write_text(
        json.dumps({"images": images, "dataset": "coco"}), encoding="utf-8"
    )
    for coco_folder, (entries, annotations) in official.items():
        (folder / f"captions_{coco_folder}.json").write_text(
            json.dumps({"info": {}, "licenses": [], "images": entries, "annotations": annotations}),
            encoding="utf-8",
        )


def measure(folder: Path, dataset: str, mode: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(folder), dataset, mode],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, help="where to write the files (default: a temporary folder)")
    parser.add_argument(
        "--captions", type=Path, default=REAL_CAPTIONS, help="JSON of real captions to draw from"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for dataset in ("karpathy", "coco"):  # the first start must find no index
            shutil.rmtree(folder / f"cache_{dataset}", ignore_errors=True)
        write_dataset(folder, _caption_pool(args.captions))
        sizes = {
            name: (folder / name).stat().st_size / 2**20
            for name in ("dataset_coco.json", "captions_train2014.json", "captions_val2014.json")
        }
        results = {
            f"{dataset}_{mode}": measure(folder, dataset, mode)
            for dataset in ("karpathy", "coco")
            for mode in ("plain", "first", "warm", "warm_split")
        }
    if args.json:
        print(json.dumps({"file_mb": sizes, **results}, indent=1))
        return
    print(", ".join(f"{name} {size:.0f} MiB" for name, size in sizes.items()))
    print(
        f"{'start':<20} {'seconds':>8} {'CPU s':>7} {'peak MiB':>9} {'imports MiB':>12} {'images':>8} "
        f"{'captions':>9}"
    )
    for name, row in results.items():
        print(
            f"{name:<20} {row['seconds']:>8.2f} {row['cpu_seconds']:>7.2f} {row['peak_mb']:>9.0f} "
            f"{row['imports_mb']:>12.0f} "
            f"{row['images']:>8} {row['captions']:>9}"
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
