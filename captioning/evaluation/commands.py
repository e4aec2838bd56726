"""What ``evaluate.py`` does for each of its three uses."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from captioning.config import ConfigError, load_config
from captioning.data.folder import read_folder
from captioning.evaluation.runner import (
    caption_records,
    decode_config_with,
    default_instances,
    load_captioner,
    score_captioned,
    score_results_file,
    split_records,
    write_results,
    write_scores,
)
from captioning.training.run import resolve_device


def _print_summary(files: dict[str, Path]) -> None:
    print("wrote:")
    for what, path in files.items():
        print(f"  {what:<22} {path}")


def _scores_paths(out: Path | None, results: Path) -> Path:
    return out if out is not None else results.with_name(results.stem + ".scores.json")


def evaluate(args: argparse.Namespace) -> dict | None:
    """Dispatch on the arguments of ``evaluate.py``; returns the scores when some were computed."""
    use_java = False if args.no_java else None
    if args.annotations is not None:
        if args.results is None or args.checkpoint is not None or args.images is not None:
            raise ConfigError("--annotations scores an existing file: give --results and no --checkpoint/--images")
        if not args.results.is_file():
            raise ConfigError(f"{args.results}: results file not found")
        scores = score_results_file(args.annotations, args.results, use_java=use_java, spice=args.spice)
        print(scores["table"])
        scores_path, per_image = write_scores(_scores_paths(args.out, args.results), scores)
        _print_summary({"scores": scores_path, "per-image scores": per_image})
        return scores

    if args.checkpoint is None:
        raise ConfigError("give --checkpoint (with --split or --images), or --annotations with --results")
    if (args.split is None) == (args.images is None):
        raise ConfigError("with --checkpoint give exactly one of --split or --images")
    device = resolve_device(args.device)
    model, config = load_captioner(args.checkpoint, device)
    if args.config is not None:
        config = replace(config, data=load_config(args.config).data)
    decode_config = decode_config_with(config, strategy=args.strategy, beam_size=args.beam_size,
                                       max_length=args.max_length, length_alpha=args.length_alpha,
                                       block_trigrams=args.block_trigrams)
    run_dir = args.checkpoint.resolve().parent.parent
    progress = not args.no_progress

    if args.images is not None:
        records = read_folder(args.images)
        captioned = caption_records(model, config, records, device, decode_config, progress)
        results = write_results(args.results or run_dir / "folder_results.json", captioned)
        paths = {str(item.record.image_id): str(item.record.path) for item in captioned}
        index = results.with_name(results.stem + ".images.json")
        index.write_text(json.dumps(paths, indent=1))
        for item in captioned[:10]:
            print(f"{item.record.path.name}: {' '.join(item.words)}")
        _print_summary({"captions": results, "image id -> file": index})
        return None

    records = split_records(config, args.split)
    captioned = caption_records(model, config, records, device, decode_config, progress, output_dir=run_dir)
    results = write_results(args.results or run_dir / f"{args.split}_results.json", captioned)
    instances = args.instances or default_instances(config)
    scores = score_captioned(captioned, model.grid, instances, use_java=use_java)
    scores["checkpoint"] = str(args.checkpoint)
    print(scores["table"])
    if "grounding-mass" in scores:
        print(f"grounding: mass in box {scores['grounding-mass']}, pointing game {scores['grounding-pointing']} "
              f"({scores['grounding-words']} object words)")
    scores_path, per_image = write_scores(_scores_paths(args.out, results), scores)
    _print_summary({"captions": results, "scores": scores_path, "per-image scores": per_image})
    return scores
