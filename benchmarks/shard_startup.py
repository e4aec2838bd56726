"""Start-up cost of reading the records of a WebDataset shard set, cold and warm.

Writes, in a temporary folder (or ``--folder``), ``--shards`` shards of ``--per-shard`` samples each
in img2dataset's layout, with the test suite's writer (``tests/shard_fixture.py``: webdataset's
``TarWriter``, a small JPEG, a ``json`` and a ``txt`` per sample; 20 x 1,000 by default), then
measures, each in a fresh process (wall time, CPU time of the process, and the CPU cores other
processes used meanwhile, ``harness.OtherLoad``):

- ``headers``: ``read_shards`` with no kept listings, what every start cost before they were kept
  (each shard's tar headers read through the whole file);
- ``cold``: a training start's ``load_records`` (``write_index``) that finds no listing yet: it reads
  the headers and keeps the listings;
- ``warm``: the same start with the listings kept: no tar header is read.

Each is run ``--repeats`` times (default 3, in the order headers, cold, warm, again and again; the
listings are deleted before each cold run) and the median reported; the load average is read before
and after.

    python benchmarks/shard_startup.py            # a table (under two minutes on 2 cores)
    python benchmarks/shard_startup.py --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_MEASURE = """
import json, logging, sys, time
sys.path.insert(0, sys.argv[3])
logging.disable(logging.WARNING)
from harness import OtherLoad
from captioning.config import DataConfig
from captioning.data import load_records
from captioning.data.shards import read_shards

folder, mode = sys.argv[1], sys.argv[2]
config = DataConfig(dataset="webdataset", root=f"{folder}/shards", cache_dir=f"{folder}/cache")
with OtherLoad() as other:
    start, cpu_start = time.perf_counter(), time.process_time()
    if mode == "headers":
        records = read_shards(config.root)
    else:
        records = load_records(config, write_index=True)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "other_cores": other.cores,
                  "images": len(records)}))
"""

MODES = ("headers", "cold", "warm")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def write_shards(folder: Path, shards: int, per_shard: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from shard_fixture import write_img2dataset

    write_img2dataset(folder, shards=shards, per_shard=per_shard)


def measure(folder: Path, mode: str) -> dict:
    if mode == "cold":
        shutil.rmtree(folder / "cache", ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(folder), mode, str(ROOT / "benchmarks")],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "", "OMP_NUM_THREADS": "1"},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, help="where to write the shards (default: a temporary folder)")
    parser.add_argument("--shards", type=int, default=20, help="shards to write (default 20)")
    parser.add_argument("--per-shard", type=int, default=1000, help="samples per shard (default 1,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each start (default 3; the median)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.folder or Path(temporary)
        shutil.rmtree(folder / "shards", ignore_errors=True)
        write_shards(folder / "shards", args.shards, args.per_shard)
        shard_mib = sum(path.stat().st_size for path in (folder / "shards").glob("*.tar")) / 2**20
        load_before = _loadavg()
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                runs[mode].append(measure(folder, mode))
        load_after = _loadavg()
        listing_kib = sum(path.stat().st_size for path in (folder / "cache").rglob("*.json")) / 2**10
    results = {
        mode: {
            "seconds": statistics.median(run["seconds"] for run in found),
            "cpu_seconds": statistics.median(run["cpu_seconds"] for run in found),
            "other_cores": max((run["other_cores"] or 0.0) for run in found),
            "images": found[0]["images"],
        }
        for mode, found in runs.items()
    }
    summary = {
        "shards": args.shards,
        "per_shard": args.per_shard,
        "shard_mib": shard_mib,
        "listings_kib": listing_kib,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        **results,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print(
        f"{args.shards} shards x {args.per_shard} samples ({shard_mib:.0f} MiB), listings {listing_kib:.0f} "
        f"KiB; load average {load_before} before, {load_after} after"
    )
    print(f"{'start':<8} {'wall s':>7} {'CPU s':>6} {'other cores':>12} {'images':>7}")
    for mode, row in results.items():
        print(
            f"{mode:<8} {row['seconds']:>7.2f} {row['cpu_seconds']:>6.2f} {row['other_cores']:>12.2f} "
            f"{row['images']:>7}"
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())
