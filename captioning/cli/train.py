"""The whole main job behind ``python train.py``: train, score the test split, draw, summarise."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

import torch

from captioning.config import Config
from captioning.data import check_data_paths
from captioning.evaluation.degenerate import degenerate_captions
from captioning.evaluation.grounding import Instances
from captioning.evaluation.runner import (
    default_instances,
    load_boxes,
    score_captioned,
    summary_lines,
    write_results,
    write_scores,
)
from captioning.evaluation.scorers import check_validation_metric
from captioning.explain.options import run_settings
from captioning.explain.study import FaithfulnessSettings
from captioning.inference.captioner import caption_records, load_trained_captioner, split_records
from captioning.training.cache_only import cache_features
from captioning.training.run import RunOutputs, best_checkpoint, start_run
from captioning.utils import distributed
from captioning.utils.device import resolve_device
from captioning.utils.json_files import read_json_file

# The run report shows this many test images at most (each one's attention maps are embedded).
REPORT_IMAGES = 200


def evaluate_test_split(
    output_dir: Path,
    device: torch.device,
    progress: bool,
    outputs: RunOutputs,
    figures: int = 6,
    boxes: Instances | None = None,
    study: FaithfulnessSettings | None = None,
) -> dict:
    """Score the best checkpoint on the test split; write results, scores, figures and the report.

    ``boxes`` are the configured instances files, read before training; without them, the
    dataset's own (Shapes') are read here. ``study``: the faithfulness study to end with
    (``train.faithfulness``), its table in the scores and its page ``test_faithfulness.html``.
    """
    checkpoint = best_checkpoint(output_dir)
    model, config, reward = load_trained_captioner(checkpoint, device)
    records = split_records(config, "test")
    captioned = caption_records(model, config, records, device, progress=progress, output_dir=output_dir)
    outputs.files["test captions"] = write_results(
        output_dir / "test_results.json", captioned, config.data.tokenizer
    )
    if boxes is None:
        boxes = load_boxes(default_instances(config))
    scores = score_captioned(
        captioned,
        model.grid,
        boxes,
        decode=config.decode,
        checkpoint=checkpoint,
        chair=config.data.chair_table,
        reward=reward,
        tokenizer=config.data.tokenizer,
        tolerance=config.data.pointing_tolerance,
    )
    scores["checkpoint"] = str(checkpoint)
    explained: list = []  # each explained image's maps per method, for the faithfulness page
    if study is not None:
        from captioning.explain.split import shared_baseline, signature_field, split_study, table_lines

        study = replace(study, pointing_tolerance=config.data.pointing_tolerance)
        images = config.train.faithfulness_images
        # the baseline evaluate.py --faithfulness takes for this checkpoint (kept in the run folder)
        baseline, name = shared_baseline(
            model, config, study, device, output_dir, checkpoint, False, progress
        )
        table = split_study(
            model, config, captioned, device, study, boxes, output_dir, True, images, progress, explained,
            baseline=baseline,
        )  # fmt: skip
        scores["faithfulness"] = table
        scores["signature"] += f"|faith:{signature_field(study, table['images'], name)}"
        print("\n".join(table_lines(table)))
    scores_path, per_image_path = write_scores(output_dir / "test_scores.json", scores)
    outputs.files["test scores"] = scores_path
    if per_image_path is not None:  # none beside scores written to a device or a pipe
        outputs.files["test scores per image"] = per_image_path
    if study is not None:
        from captioning.cli.faithfulness import write_faithfulness_page

        outputs.files["faithfulness page"] = write_faithfulness_page(
            output_dir / "test_faithfulness.html", scores, explained, captioned, model.grid, 20, progress
        )
    outputs.caption_warning = degenerate_captions(
        [item.text for item in captioned], "test", config.data.tokenizer
    )
    print(f"test split ({len(captioned)} images, {checkpoint.name}):\n{scores['table']}")
    for line in summary_lines(scores, len(captioned)):
        print(line)
    if figures:
        from captioning.visualization.report import write_figures

        label = model.decoder.describe_attention()
        write_figures(
            captioned[:figures], output_dir / "figures", model.grid, attention_label=label, boxes=boxes
        )
        outputs.files["attention figures"] = output_dir / "figures"
        outputs.files["HTML report"] = write_report_of_run(
            output_dir, captioned, model.grid, scores, checkpoint, boxes, label
        )
    return scores


def write_report_of_run(
    output_dir: Path,
    captioned: list,
    grid: tuple[int, int],
    scores: dict,
    checkpoint: Path,
    boxes: Instances | None,
    attention_label: str,
    report_images: int = REPORT_IMAGES,
) -> Path:
    """``report.html``: the run's configuration, checkpoint, test scores, curves and its first
    ``report_images`` test images, sortable by their scores (``run_report.write_run_report``)."""
    from captioning.visualization.run_report import write_run_report

    config_path, history_path = output_dir / "config.yaml", output_dir / "history.json"
    config_text = config_path.read_text(encoding="utf-8") if config_path.is_file() else ""
    stored = read_json_file(history_path) if history_path.is_file() else {}
    history = stored.get("epochs", [])
    weight = ((stored.get("config") or {}).get("model") or {}).get("decoder", {}).get("doubly_stochastic")
    return write_run_report(
        output_dir / "report.html",
        captioned[:report_images],
        grid,
        scores,
        config_text=config_text,
        checkpoint=checkpoint,
        history=history,
        boxes=boxes,
        attention_label=attention_label,
        total_images=len(captioned),
        penalty_weight=float(weight) if isinstance(weight, int | float) else None,
    )


def summary(outputs: RunOutputs) -> str:
    """The closing lines: every file the run wrote, then the warning about its captions if they say
    nothing (the test split's when it was scored, else the last validation's)."""
    lines = ["files written:"]
    for what, path in outputs.files.items():
        lines.append(f"  {what:<24} {path}")
    if outputs.caption_warning:
        lines.append(outputs.caption_warning)
    return "\n".join(lines)


def main_job(
    config: Config,
    resume: str | Path | None = None,
    progress: bool = True,
    test: bool = True,
    length_given: Collection[str] | None = None,
) -> RunOutputs:
    """Train, then (on rank 0) evaluate the test split with figures and an HTML report.

    The configured instances files are read first, so that a bad one fails before training.
    ``length_given``: as for ``training.run.train`` (the length keys the command line set).
    """
    is_main = distributed.launched_as_main()
    check_data_paths(config.data)  # a mistyped path names its key before the instances are read
    check_validation_metric(config.train.metric)  # also for a configuration built in Python
    boxes = load_boxes(config.data.instances) if test and is_main else None
    study = run_settings(config) if test else None  # its methods and their library, before training
    with start_run(config, resume, progress, test, length_given) as run:  # claim, resume, reseed
        run.trainer.fit()  # the training loop: epochs of both stages, validation, checkpoints
    outputs = run.outputs
    try:
        if test and is_main:
            evaluate_test_split(
                Path(config.train.output_dir),
                resolve_device(config.train.device),
                progress,
                outputs,
                boxes=boxes,
                study=study,
            )
        if distributed.init_from_environment("cpu").is_main:
            print(summary(outputs), flush=True)
    finally:  # the folder is free once the job ends: a later run in this process (a notebook's) may use it
        if outputs.lock is not None:
            outputs.lock.release()
    distributed.shutdown()
    return outputs


def cache_only(config: Config, progress: bool = True) -> RunOutputs:
    """Generate/read the data and fill the feature cache of every split; nothing is trained.

    Under ``torchrun`` every rank encodes its share of the images still without features.
    """
    try:
        files, lock = cache_features(config, progress)
        outputs = RunOutputs(Path(config.train.output_dir), files=files, lock=lock)
        lock.release()
        if distributed.launched_as_main():  # under torchrun, rank 0 alone reports
            print(summary(outputs), flush=True)
    finally:
        distributed.shutdown()
    return outputs
