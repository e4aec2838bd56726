"""Cost per image of each attribution method and of its deletion and insertion curves, on a trained run.

    python benchmarks/explain_cost.py --checkpoint runs/shapes/checkpoints/best.pt --images 8

Run it where the run was trained (its ``data.root`` is read relative to there): the test split's first
``--images`` images are captioned from the existing feature cache (nothing is written), then each
method explains their words (``captioning.explain``) and its curves are read, each timed once per
repeat (the median is printed), with the machine's load beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from captioning.explain.captions import curve_settings, explain_batch, method_settings
from captioning.explain.faithfulness import method_curves, random_curves
from captioning.explain.methods import applicable_methods
from captioning.explain.split import split_grids
from captioning.explain.study import FaithfulnessSettings
from captioning.inference.captioner import caption_records, load_captioner, split_records


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained run's checkpoint")
    parser.add_argument("--images", type=int, default=8, help="test images explained together (8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per number (3; median)")
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--curve-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    return parser


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    model, config = load_captioner(args.checkpoint, device)
    records = split_records(config, "test", generate=False)[: args.images]
    captioned = caption_records(model, config, records, device, progress=False, build_cache=False)
    grids = split_grids(model, config, captioned, device, Path("."), build_cache=False, progress=False)
    tokens = [item.caption.tokens for item in captioned]
    baseline = grids.mean(dim=(0, 1))
    methods = applicable_methods(model.decoder)
    settings = FaithfulnessSettings(methods=methods, ig_steps=args.ig_steps, curve_steps=args.curve_steps)
    words = sum(len(t) for t in tokens)
    rows = {}
    for name in methods:
        explain_times, curve_times = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            maps, scorer = explain_batch(
                model.decoder, grids, tokens, [name], baseline, method_settings(settings)
            )
            explain_times.append(time.perf_counter() - start)
            index = scorer.word_mask.nonzero()
            start = time.perf_counter()
            method_curves(
                scorer.words_at, grids, baseline, maps[name][index[:, 0], index[:, 1]], index, settings.curves
            )
            curve_times.append(time.perf_counter() - start)
        rows[name] = {
            "explain_s_per_image": statistics.median(explain_times) / len(tokens),
            "curves_s_per_image": statistics.median(curve_times) / len(tokens),
        }
    _, scorer = explain_batch(
        model.decoder, grids, tokens, ["attention"], baseline, method_settings(settings)
    )
    index = scorer.word_mask.nonzero()
    start = time.perf_counter()
    random_curves(scorer.words_at, grids, baseline, index, replace(curve_settings(settings), random_seeds=1))
    result = {
        "checkpoint": str(args.checkpoint),
        "decoder": config.model.decoder.kind,
        "grid": list(model.grid),
        "images": len(tokens),
        "words": words,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "ig_steps": args.ig_steps,
        "curve_steps": args.curve_steps,
        "random_order_curves_s_per_image_per_seed": (time.perf_counter() - start) / len(tokens),
        "methods": rows,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{result['decoder']} decoder, {result['grid'][0]}x{result['grid'][1]} grid, {len(tokens)} images, "
        f"{words} words, {result['threads']} threads, load average {result['load_average'][0]:.1f}"
    )
    print(f"{'method':<22}{'explain s/image':>16}{'curves s/image':>16}")
    for name, row in rows.items():
        print(f"{name:<22}{row['explain_s_per_image']:>16.3f}{row['curves_s_per_image']:>16.3f}")
    print(f"{'random order (1 seed)':<22}{'':>16}{result['random_order_curves_s_per_image_per_seed']:>16.3f}")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
