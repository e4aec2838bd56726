"""Captioning a folder of images with PyTorch and with ONNX Runtime (and its int8 decoder step).

::

    python benchmarks/onnx_speed.py runs/shapes data/shapes/test            # a table
    python benchmarks/onnx_speed.py runs/shapes data/shapes/test --json     # one JSON object

The model (a run folder, checkpoint or model folder) is loaded on the CPU and exported twice into a
temporary folder, ``model.export(folder, format="onnx")`` and with ``quantise="int8"``; each of the
three then captions the same image files with ``model.caption(paths, beam_size=K)``: the files read,
resized and normalised, the encoder, beam search and the attention maps, as the Python API returns
them. Reported: images per second (the median of ``--repeats`` timed runs after one untimed one),
how many captions have the PyTorch model's exact words, the largest difference of a caption's
log-probability from PyTorch's, the export's time and size, and the machine's load (the load average,
and the cores other processes used meanwhile: near 0 means an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the captioning package of this checkout; the harness

from harness import OtherLoad, median_seconds  # noqa: E402

import captioning  # noqa: E402
from captioning.data.folder import IMAGE_SUFFIXES  # noqa: E402


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path, help="a run folder, checkpoint or model folder")
    parser.add_argument("images", type=Path, help="a folder of images (its files, sorted by name)")
    parser.add_argument("--limit", type=int, default=0, help="caption the first N files only (0: all)")
    parser.add_argument("--beam-size", type=int, default=3, help="beam size (1: greedy)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per runtime (median reported)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return parser


def caption_run(model: captioning.CaptioningModel, paths: list[Path], beam_size: int, repeats: int) -> dict:
    """Captions of ``paths`` and the median images per second over ``repeats`` timed runs."""
    strategy = "beam" if beam_size > 1 else "greedy"
    captions: list[captioning.Caption] = []

    def run() -> None:
        captions[:] = model.caption(paths, strategy=strategy, beam_size=beam_size)

    with OtherLoad() as load:
        seconds = median_seconds(run, repeats, torch.device("cpu"))
    return {"images_per_s": len(paths) / seconds, "captions": captions, "other_cores": load.cores}


def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    # ONNX Runtime's intra-op threads: torch's (captioning.export.runtime reads OMP_NUM_THREADS)
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    paths = sorted(p for p in args.images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    paths = paths[: args.limit] if args.limit else paths
    if not paths:
        raise SystemExit(f"error: {args.images}: no image files")
    load_before = os.getloadavg()[0]
    model = captioning.load(args.model, device="cpu")
    results: dict[str, Any] = {
        "model": str(model.source),
        "decoder": model.config.model.decoder.kind,
        "images": len(paths),
        "beam_size": args.beam_size,
        "threads": torch.get_num_threads(),
        "load_average_start": load_before,
    }
    runs = {"torch": caption_run(model, paths, args.beam_size, args.repeats)}
    reference = runs["torch"]["captions"]
    with tempfile.TemporaryDirectory() as scratch:
        for name, quantise in (("onnxruntime", "none"), ("onnxruntime_int8", "int8")):
            start = time.perf_counter()
            folder = model.export(Path(scratch) / name, quantise=quantise)
            results[f"{name}_export_s"] = time.perf_counter() - start
            results[f"{name}_mb"] = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
            onnx_model = captioning.load(folder, runtime="onnxruntime")
            runs[name] = caption_run(onnx_model, paths, args.beam_size, args.repeats)
            got = runs[name]["captions"]
            results[f"{name}_same_words"] = sum(
                a.words == b.words for a, b in zip(reference, got, strict=True)
            )
            results[f"{name}_max_log_prob_diff"] = max(
                (
                    abs(a.log_prob - b.log_prob)
                    for a, b in zip(reference, got, strict=True)
                    if a.words == b.words
                ),
                default=float("nan"),  # no caption with PyTorch's words
            )
    for name, run in runs.items():
        results[f"{name}_images_per_s"] = run["images_per_s"]
        results[f"{name}_other_cores"] = run["other_cores"]
    for name in ("onnxruntime", "onnxruntime_int8"):
        results[f"{name}_speedup"] = runs[name]["images_per_s"] / runs["torch"]["images_per_s"]
    results["load_average_end"] = os.getloadavg()[0]
    return results


def table(results: dict[str, Any]) -> str:
    r = results
    rows = [
        f"{r['images']} images of {r['model']} ({r['decoder']}), beam {r['beam_size']}, "
        f"{r['threads']} threads; load average {r['load_average_start']:.2f} -> {r['load_average_end']:.2f}",
        "| runtime | images/s | vs torch | same words | max log-prob diff | other cores |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| torch | {r['torch_images_per_s']:.2f} | 1.00 | - | - | {r['torch_other_cores'] or 0:.2f} |",
    ]
    for name in ("onnxruntime", "onnxruntime_int8"):
        rows.append(
            f"| {name} | {r[f'{name}_images_per_s']:.2f} | {r[f'{name}_speedup']:.2f} | "
            f"{r[f'{name}_same_words']}/{r['images']} | {r[f'{name}_max_log_prob_diff']:.2e} | "
            f"{r[f'{name}_other_cores'] or 0:.2f} |"
        )
    rows.append(
        f"export: {r['onnxruntime_export_s']:.1f} s, {r['onnxruntime_mb']:.1f} MB "
        f"(int8: {r['onnxruntime_int8_export_s']:.1f} s, {r['onnxruntime_int8_mb']:.1f} MB)"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    arguments = get_args_parser().parse_args()
    measured = main(arguments)
    print(json.dumps(measured, indent=2) if arguments.json else table(measured))
