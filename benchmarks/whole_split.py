"""The whole faithfulness study of a test split, timed: the plan printed first, then the study.

    python benchmarks/whole_split.py --checkpoint runs/shapes/checkpoints/best_scst.pt --threads 2

Run it where the run was trained (its ``data.root`` is read relative to there): the test split's
first ``--images`` images (0: all; the demo's 200) are captioned from the existing feature cache
(nothing is written), the plan of ``evaluate.py --faithfulness`` is printed with its estimated time,
then the study runs as ``evaluate.py --faithfulness`` runs it (every method that fits the model, grid
curves, ``--random-seeds`` random orders, the cascading randomisation on ``--sanity-images``; with
``--pixel-steps N`` RISE's pixel protocol too), boxes and all. Printed: the wall-clock and process
CPU seconds of the decoding and of the study, per image, the estimate beside them, and the machine's
load average before and after (2 shared cores here: another job's load slows the wall clock, not the
CPU seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from captioning.evaluation.runner import default_instances, load_boxes
from captioning.explain.config import ExplainConfig, signature_part
from captioning.explain.methods import applicable_methods
from captioning.explain.split import shared_baseline, split_study
from captioning.inference.captioner import caption_records, load_captioner, split_records


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained run's checkpoint")
    parser.add_argument("--images", type=int, default=0, help="test images explained (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (2)")
    parser.add_argument("--ig-steps", type=int, default=16)
    parser.add_argument("--curve-steps", type=int, default=10)
    parser.add_argument("--random-seeds", type=int, default=3)
    parser.add_argument("--sanity-images", type=int, default=8)
    parser.add_argument("--pixel-steps", type=int, default=0, help="RISE's pixel curves' steps (0: none)")
    parser.add_argument("--pixel-deletion-value", type=float, default=0.0)
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    return parser


def main(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    load_before = os.getloadavg()
    model, config = load_captioner(args.checkpoint, device)
    records = split_records(config, "test", generate=False)
    records = records[: args.images or None]
    wall, cpu = time.perf_counter(), time.process_time()
    captioned = caption_records(model, config, records, device, progress=False, build_cache=False)
    decode_wall, decode_cpu = time.perf_counter() - wall, time.process_time() - cpu
    settings = ExplainConfig(
        methods=applicable_methods(model.decoder),
        ig_steps=args.ig_steps,
        curve_steps=args.curve_steps,
        random_seeds=args.random_seeds,
        sanity_images=args.sanity_images,
        pointing_tolerance=config.data.pointing_tolerance,
        pixel_steps=args.pixel_steps,
        pixel_deletion_value=args.pixel_deletion_value,
    )
    boxes = load_boxes(default_instances(config))
    run = args.checkpoint.parent.parent  # <run>/checkpoints/x.pt: the training mean kept there
    wall, cpu = time.perf_counter(), time.process_time()
    baseline, _ = shared_baseline(model, config, settings, device, run, args.checkpoint)
    study = split_study(
        model, config, captioned, device, settings, boxes, Path("."), build_cache=False, progress=False,
        baseline=baseline,
    )  # fmt: skip
    study_wall, study_cpu = time.perf_counter() - wall, time.process_time() - cpu
    images = study["images"]
    result = {
        "checkpoint": str(args.checkpoint),
        "decoder": config.model.decoder.kind,
        "images": images,
        "words": study["plan"]["words"],
        "methods": list(settings.methods),
        "settings": signature_part(settings, images),
        "threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "decode_wall_s": decode_wall,
        "decode_cpu_s": decode_cpu,
        "study_wall_s": study_wall,
        "study_cpu_s": study_cpu,
        "study_wall_s_per_image": study_wall / images,
        "estimated_s": study["plan"]["estimated_seconds"],
    }
    print(
        f"{images} images, {result['words']} words, {len(settings.methods)} methods, "
        f"{result['threads']} threads: decoding {decode_wall:.0f} s; study {study_wall:.0f} s wall "
        f"({study_wall / images:.2f} s/image), {study_cpu:.0f} s CPU; estimated "
        f"{sum(result['estimated_s'].values()):.0f} s; load average {load_before[0]:.1f} before, "
        f"{result['load_average_after'][0]:.1f} after"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


if __name__ == "__main__":
    main(get_args_parser().parse_args())
