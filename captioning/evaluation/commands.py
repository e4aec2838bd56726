"""What ``evaluate.py`` does for each of its three uses."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from captioning.config import (
    CHECKPOINT_SECTIONS,
    Config,
    ConfigError,
    apply_overrides,
    check_overrides,
    load_config,
    parse_overrides,
)
from captioning.data.folder import read_folder
from captioning.evaluation.hallucination import chair_line
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
from captioning.training.checkpoint import atomic_write
from captioning.training.run import resolve_device


def _print_summary(files: dict[str, Path]) -> None:
    print("wrote:")
    for what, path in files.items():
        print(f"  {what:<22} {path}")


def _report_skipped(records: list, captioned: list) -> None:
    """One line saying how many images were left out as unreadable (``data.skip_bad_images``)."""
    if len(captioned) < len(records):
        print(f"skipped {len(records) - len(captioned)} of {len(records)} images that could not be read "
              "(data.skip_bad_images); they are not in the results", flush=True)


def scores_text(scores: dict) -> str:
    """The metrics table, grounding and CHAIR when computed, and the signature last."""
    lines = [scores["table"]]
    if scores.get("grounding-mass") is not None:
        lines.append(f"grounding: mass in box {scores['grounding-mass']}, pointing game "
                     f"{scores['grounding-pointing']} ({scores['grounding-words']} object words)")
    if chair_line(scores) is not None:
        lines.append(chair_line(scores))
    lines.append(f"signature: {scores['signature']}")
    return "\n".join(lines)


def _compare_or_aggregate(args: argparse.Namespace, use_java: bool | None) -> dict:
    """``--compare A B --annotations REFS`` or ``--aggregate SCORES...`` (nothing is decoded)."""
    if args.checkpoint is not None or args.images is not None or args.results is not None:
        raise ConfigError("--compare and --aggregate read existing files: give no --checkpoint/--images/--results")
    if args.aggregate:
        if args.compare:
            raise ConfigError("give one of --compare or --aggregate")
        from captioning.evaluation.aggregate import aggregate_command

        return aggregate_command(args.aggregate, args.out)
    if args.annotations is None:
        raise ConfigError("--compare needs --annotations (the reference captions of both systems' images)")
    from captioning.evaluation.compare import compare_command

    return compare_command(args.annotations, *args.compare, args.out, use_java, args.spice, args.resamples,
                           args.seed)


def _scores_paths(out: Path | None, results: Path) -> Path:
    return out if out is not None else results.with_name(results.stem + ".scores.json")


def evaluate(args: argparse.Namespace) -> dict | None:
    """Dispatch on the arguments of ``evaluate.py``; returns the scores when some were computed."""
    use_java = False if args.no_java else None
    if getattr(args, "aggregate", None) or getattr(args, "compare", None):
        return _compare_or_aggregate(args, use_java)
    if args.annotations is not None:
        if args.results is None or args.checkpoint is not None or args.images is not None:
            raise ConfigError("--annotations scores an existing file: give --results and no --checkpoint/--images")
        if not args.results.is_file():
            raise ConfigError(f"{args.results}: results file not found")
        scores = score_results_file(args.annotations, args.results, use_java=use_java, spice=args.spice,
                                    instances=args.instances)
        print(scores_text(scores))
        scores_path, per_image = write_scores(_scores_paths(args.out, args.results), scores)
        _print_summary({"scores": scores_path, "per-image scores": per_image})
        return scores

    if args.checkpoint is None:
        raise ConfigError("give --checkpoint (with --split or --images), or --annotations with --results")
    if (args.split is None) == (args.images is None):
        raise ConfigError("with --checkpoint give exactly one of --split or --images")
    decoding = {"strategy": args.strategy, "beam_size": args.beam_size, "max_length": args.max_length,
                "length_alpha": args.length_alpha, "block_trigrams": args.block_trigrams}
    overrides = parse_overrides(args.overrides)
    # Cheap checks first, so that a typo fails in a moment rather than after loading the model.
    check_overrides(overrides, CHECKPOINT_SECTIONS)
    decode_config_with(Config(), **decoding)
    records = read_folder(args.images) if args.images is not None else None
    data_config = load_config(args.config).data if args.config is not None else None
    device = resolve_device(args.device)
    model, config = load_captioner(args.checkpoint, device)
    if data_config is not None:
        config = replace(config, data=data_config)
    config = apply_overrides(config, overrides, CHECKPOINT_SECTIONS)
    if args.skip_bad_images:
        config = replace(config, data=replace(config.data, skip_bad_images=True))
    decode_config = decode_config_with(config, **decoding)
    run_dir = args.checkpoint.resolve().parent.parent
    progress = not args.no_progress

    if records is not None:
        captioned = caption_records(model, config, records, device, decode_config, progress)
        _report_skipped(records, captioned)
        results = write_results(args.results or run_dir / "folder_results.json", captioned)
        paths = {str(item.record.image_id): str(item.record.path) for item in captioned}
        index = results.with_name(results.stem + ".images.json")
        atomic_write(index, lambda p: p.write_text(json.dumps(paths, indent=1), encoding="utf-8"))
        for item in captioned[:10]:
            print(f"{item.record.path.name}: {' '.join(item.words)}")
        _print_summary({"captions": results, "image id -> file": index})
        return None

    records = split_records(config, args.split)
    captioned = caption_records(model, config, records, device, decode_config, progress, output_dir=run_dir)
    _report_skipped(records, captioned)
    results = write_results(args.results or run_dir / f"{args.split}_results.json", captioned)
    instances = args.instances or default_instances(config)
    scores = score_captioned(captioned, model.grid, instances, use_java=use_java, spice=args.spice,
                             decode=decode_config, checkpoint=args.checkpoint)
    scores["checkpoint"] = str(args.checkpoint)
    print(scores_text(scores))
    scores_path, per_image = write_scores(_scores_paths(args.out, results), scores)
    _print_summary({"captions": results, "scores": scores_path, "per-image scores": per_image})
    return scores
