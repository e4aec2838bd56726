"""The whole main job behind ``python train.py``: train, score the test split, draw, summarise."""

from __future__ import annotations

from pathlib import Path

import torch

from captioning.config import Config
from captioning.data import check_data_paths
from captioning.evaluation.grounding import Instances
from captioning.evaluation.runner import (
    caption_records,
    default_instances,
    load_boxes,
    load_trained_captioner,
    score_captioned,
    split_records,
    summary_lines,
    write_results,
    write_scores,
)
from captioning.training import distributed
from captioning.training.run import RunOutputs, best_checkpoint, cache_features, resolve_device, train


def evaluate_test_split(output_dir: Path, device: torch.device, progress: bool, outputs: RunOutputs,
                        figures: int = 6, boxes: Instances | None = None) -> dict:
    """Score the best checkpoint on the test split; write results, scores, figures and the report.

    ``boxes`` are the configured instances files, read before training; without them, the
    dataset's own (Shapes') are read here.
    """
    checkpoint = best_checkpoint(output_dir)
    model, config, reward = load_trained_captioner(checkpoint, device)
    records = split_records(config, "test")
    captioned = caption_records(model, config, records, device, progress=progress, output_dir=output_dir)
    outputs.files["test captions"] = write_results(output_dir / "test_results.json", captioned)
    if boxes is None:
        boxes = load_boxes(default_instances(config))
    scores = score_captioned(captioned, model.grid, boxes, decode=config.decode, checkpoint=checkpoint,
                             chair=config.data.chair_table, reward=reward, tokenizer=config.data.tokenizer)
    scores["checkpoint"] = str(checkpoint)
    scores_path, per_image_path = write_scores(output_dir / "test_scores.json", scores)
    outputs.files["test scores"] = scores_path
    outputs.files["test scores per image"] = per_image_path
    outputs.test_scores = scores
    print(f"test split ({len(captioned)} images, {checkpoint.name}):\n{scores['table']}")
    for line in summary_lines(scores, len(captioned)):
        print(line)
    if figures:
        from captioning.visualization.report import write_figures_and_report

        written = write_figures_and_report(model, captioned[:figures], output_dir / "figures",
                                           output_dir / "report.html", attention_label=model.decoder.describe_attention())
        outputs.files.update(written)
    return scores


def summary(outputs: RunOutputs) -> str:
    """The closing lines: every file the run wrote."""
    lines = ["files written:"]
    for what, path in outputs.files.items():
        lines.append(f"  {what:<24} {path}")
    return "\n".join(lines)


def main_job(config: Config, resume: str | Path | None = None, progress: bool = True, test: bool = True) -> RunOutputs:
    """Train, then (on rank 0) evaluate the test split with figures and an HTML report.

    The configured instances files are read first, so that a bad one fails before training.
    """
    is_main = distributed.launched_as_main()
    check_data_paths(config.data)  # a mistyped path names its key before the instances are read
    boxes = load_boxes(config.data.instances) if test and is_main else None
    outputs = train(config, resume=resume, progress=progress, test=test)
    try:
        if test and is_main:
            evaluate_test_split(Path(config.train.output_dir), resolve_device(config.train.device), progress,
                                outputs, boxes=boxes)
        if distributed.init_from_environment("cpu").is_main:
            print(summary(outputs), flush=True)
    finally:  # the folder is free once the job ends: a later run in this process (a notebook's) may use it
        if outputs.lock is not None:
            outputs.lock.release()
    distributed.shutdown()
    return outputs


def cache_only(config: Config, progress: bool = True) -> RunOutputs:
    """Generate/read the data and fill the feature cache of every split; nothing is trained."""
    files, lock = cache_features(config, progress)
    outputs = RunOutputs(Path(config.train.output_dir), files=files, lock=lock)
    lock.release()
    print(summary(outputs), flush=True)
    return outputs
