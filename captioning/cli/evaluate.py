"""What ``evaluate.py`` does for each of its uses."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from captioning.cli.common import (
    check_config_extras,
    checkpoint_to_read,
    load_for_tool,
    refuse_export_for_attribution,
)
from captioning.cli.compare import compare_or_aggregate
from captioning.cli.decoding_flags import check_decoding_values, decoding_changes
from captioning.cli.evaluation_files import (
    EvaluationFiles,
    named_outputs,
    notes_of,
    planned_files,
    print_written,
    scores_file,
)
from captioning.cli.faithfulness import (
    faithfulness_settings,
    fitted_methods,
    prepare_study,
    shuffled_decoder,
    write_faithfulness_page,
)
from captioning.config import Config, ConfigError
from captioning.config.loading import (
    CHECKPOINT_SECTIONS,
    apply_overrides,
    check_overrides,
    load_config,
    parse_overrides,
    with_data_section,
)
from captioning.data.folder import read_folder
from captioning.data.readers import DATASETS, reader_of
from captioning.data.records import ImageRecord
from captioning.data.tokenizers import TOKENIZERS
from captioning.evaluation.caption_sets import caption_set_lines
from captioning.evaluation.runner import (
    caption_set_scores,
    default_instances,
    load_boxes,
    per_image_path,
    score_captioned,
    score_results_file,
    summary_lines,
    write_ranked_results,
    write_results,
    write_scores,
)
from captioning.inference.captioner import (
    caption_records,
    decode_config_with,
    fewer_captions_warning,
    split_records,
)
from captioning.utils.device import resolve_device
from captioning.utils.extras import config_extras, preflight
from captioning.utils.files import atomic_write, not_a_regular_file
from captioning.utils.output_paths import check_outputs
from captioning.utils.text import printable


def _user_chose_paths(
    args: argparse.Namespace, overrides: Collection[str], config: Config
) -> tuple[bool, bool]:
    """(may generate data under data.root, may build a feature cache): only where the user's own
    ``--config``/``--set`` put them, never where the checkpoint's stored paths point."""
    if args.config is not None:
        return True, True
    root_chosen = "data.root" in overrides
    cache_chosen = "data.cache_dir" in overrides or (root_chosen and not config.data.cache_dir)
    # a cache under the run folder (a folder of photos: DatasetReader.cache_under_root) is the run's own
    return root_chosen, cache_chosen or not reader_of(config.data).cache_under_root(config.data)


def _warn_fewer(captioned: list, asked: int) -> None:
    """The warning line, on stderr, when some images got fewer captions than ``--num-return`` asked."""
    warning = fewer_captions_warning(captioned, asked)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)


def _report_skipped(records: list, captioned: list) -> None:
    """One line saying how many images were left out as unreadable (``data.skip_bad_images``)."""
    if len(captioned) < len(records):
        print(
            f"skipped {len(records) - len(captioned)} of {len(records)} images that could not be read "
            "(data.skip_bad_images); they are not in the results",
            flush=True,
        )


def scores_text(scores: dict, images: int) -> str:
    """The metrics table, grounding and CHAIR when computed, and the signature last."""
    return "\n".join([scores["table"], *summary_lines(scores, images)])


def evaluate(args: argparse.Namespace) -> dict | None:
    """Dispatch on the arguments of ``evaluate.py``; returns the scores when some were computed."""
    use_java = False if args.no_java else None
    _check_combinations(args)
    if getattr(args, "aggregate", None) or getattr(args, "compare", None):
        return compare_or_aggregate(args, use_java)
    if getattr(args, "clip_score", None) is not None and (args.checkpoint is None or args.split is None):
        raise ConfigError("--clip-score scores the images of a split: give it with --checkpoint and --split")
    if args.annotations is not None:
        return _score_results_file(args, use_java)
    if args.checkpoint is None:
        raise ConfigError("give --checkpoint (with --split or --images), or --annotations with --results")
    checked = _checked_options(args)
    outputs = planned_files(args, checked.records, checked.faithfulness is not None)
    loaded = _load(args, checked, outputs)
    if checked.records is not None:
        _caption_images(loaded, checked.records, outputs)
        return None
    return _caption_split(args, loaded, outputs, use_java)


def _check_combinations(args: argparse.Namespace) -> None:
    """``--tokenizer``'s name, and the options that go only with others, before any file is read."""
    if getattr(args, "tokenizer", None) is not None:
        TOKENIZERS.check(args.tokenizer)  # after --import: a module of the user's may register one
    for flag in ("against", "names"):
        if getattr(args, flag, None) and not getattr(args, "compare", None):
            raise ConfigError(f"--{flag} goes with --compare")
    if getattr(args, "faithfulness", None) is not None and (
        getattr(args, "aggregate", None) or getattr(args, "compare", None) or args.annotations is not None
    ):
        raise ConfigError(
            "--faithfulness explains the captions of a split: give it with --checkpoint and --split"
        )


def _score_results_file(args: argparse.Namespace, use_java: bool | None) -> dict:
    """``--annotations REFS --results FILE``: an existing results file scored (nothing is decoded)."""
    if args.results is None or args.checkpoint is not None or args.images is not None:
        raise ConfigError(
            "--annotations scores an existing file: give --results and no --checkpoint/--images"
        )
    if not args.results.is_file():
        raise ConfigError(f"{args.results}: {not_a_regular_file(args.results) or 'results file not found'}")
    scores_path = scores_file(args.out, args.results)
    check_outputs(
        named_outputs(("--out", scores_path), ("--out (per-image scores)", per_image_path(scores_path))),
        [
            ("--annotations", args.annotations),
            ("--results", args.results),
            *(("--instances", path) for path in args.instances or ()),
        ],
    )
    boxes = load_boxes(args.instances or ())  # read before scoring: a bad file fails at once
    scores = score_results_file(
        args.annotations,
        args.results,
        use_java=use_java,
        spice=args.spice,
        java_timeout=args.java_timeout,
        boxes=boxes,
        chair=args.chair_table or "released",
        tokenizer=args.tokenizer,
    )
    print(scores_text(scores, len(scores["per_image"])))
    notes = notes_of(scores_path, per_image_path(scores_path))
    scores_path, per_image = write_scores(scores_path, scores)
    print_written({"scores": scores_path, "per-image scores": per_image}, notes)
    return scores


@dataclass
class _Checked:
    """What ``--checkpoint`` decoding takes, checked before the model is loaded: ``--faithfulness``'s
    settings (None without), the decoding flags' ``decode.*`` values, the ``--set`` overrides, the
    records of ``--images`` (None for ``--split``) and ``--config``'s data section (None without)."""

    faithfulness: Any
    decoding: dict[str, Any]
    overrides: dict[str, Any]
    records: list[ImageRecord] | None
    data_config: Any


def _checked_options(args: argparse.Namespace) -> _Checked:
    """Every option of ``--checkpoint`` decoding checked, cheap checks first, so that a typo fails in a
    moment rather than after loading the model; ``args``' checkpoint paths become the files to read."""
    faithfulness = faithfulness_settings(args)
    if getattr(args, "data_randomised_checkpoint", None) is not None:
        if faithfulness is None:
            raise ConfigError("--data-randomised-checkpoint goes with --faithfulness")
        args.data_randomised_checkpoint = checkpoint_to_read(args.data_randomised_checkpoint)
    if (args.split is None) == (args.images is None):
        raise ConfigError("with --checkpoint give exactly one of --split or --images")
    args.checkpoint = checkpoint_to_read(args.checkpoint)
    if faithfulness is not None:
        refuse_export_for_attribution(args.checkpoint, "--faithfulness")
    decoding = decoding_changes(args)  # a flag per decode.* key
    overrides = parse_overrides(args.overrides)
    check_overrides(overrides, CHECKPOINT_SECTIONS)
    check_decoding_values(decoding)  # each flag's own range now; the rest once the checkpoint is loaded
    records = read_folder(args.images) if args.images is not None else None
    data_config = _checked_data_section(args, overrides, images=records is not None)
    return _Checked(faithfulness, decoding, overrides, records, data_config)


def _checked_data_section(args: argparse.Namespace, overrides: dict[str, Any], images: bool):
    """``--config``'s data section (None without), once the dataset and tokenizer that ``--set`` or it
    names are known and their extras installed (the checkpoint's own are checked where it is read)."""
    # Only the data section is read: a run's config.yaml of any version is taken (stored=True).
    data_config = load_config(args.config, stored=True).data if args.config is not None else None
    dataset = overrides.get("data.dataset") or (data_config.dataset if data_config is not None else None)
    if dataset is not None:  # the checkpoint's own is checked where it is first read
        DATASETS.check(dataset)
    tokenizer = overrides.get("data.tokenizer") or (data_config.tokenizer if data_config else None)
    preflight(config_extras(tokenizer=tokenizer, dataset=None if images else dataset))
    return data_config


@dataclass
class _Loaded:
    """A loaded checkpoint and how to decode with it: its configuration with the tool's changes, the
    decoding options, whether to show progress, generate data and build a feature cache, and the
    optional parts (the faithfulness settings, the data randomised decoder, the CLIP scorer)."""

    model: Any
    config: Config
    reward: Any
    device: Any
    decode: Any
    progress: bool
    generate: bool
    build_cache: bool
    faithfulness: Any = None
    shuffled: Any = None
    clip_scorer: Any = None


def _load(args: argparse.Namespace, checked: _Checked, outputs: EvaluationFiles) -> _Loaded:
    """The checkpoint loaded (after CLIP's weights with ``--clip-score``: a missing file stops first),
    its configuration changed by ``--config``, ``--set`` and the flags, and ``--faithfulness``'s
    settings fitted to its decoder."""
    device = resolve_device(args.device)
    clip_scorer = None
    # its weights before any decoding: a missing file stops now
    if getattr(args, "clip_score", None) is not None:
        from captioning.evaluation.clip_score import load_clip_scorer

        clip_scorer = load_clip_scorer(args.clip_score, device=device)
    model, config, reward, device = load_for_tool(args.checkpoint, args.device)
    shuffled = shuffled_decoder(args, model, device)  # checked before any decoding
    config = _tool_config(config, checked, args)
    # the checkpoint's own tokenizer (scoring) and dataset (a split), before any image is read
    check_config_extras(config, encoder=False, dataset=checked.records is None)
    faithfulness = checked.faithfulness
    if faithfulness is not None:
        faithfulness = replace(
            fitted_methods(faithfulness, args.faithfulness, model.decoder),
            pointing_tolerance=config.data.pointing_tolerance,
            similarity_size=config.model.encoder.image_size,
        )
    decode_config = decode_config_with(config, **checked.decoding)
    # Every caption of every image, ranked, beside the results file when several are asked for
    # (by a flag, --set or the checkpoint's own decode.num_return).
    if decode_config.num_return > 1:
        outputs.add_ranked()
    generate, build_cache = _user_chose_paths(args, checked.overrides, config)
    progress = not args.no_progress
    return _Loaded(
        model,
        config,
        reward,
        device,
        decode_config,
        progress,
        generate,
        build_cache,
        faithfulness,
        shuffled,
        clip_scorer,
    )


def _tool_config(config: Config, checked: _Checked, args: argparse.Namespace) -> Config:
    """The checkpoint's configuration with ``--config``'s data section, ``--set`` and the scoring flags."""
    if checked.data_config is not None:
        config = with_data_section(config, checked.data_config)
    config = apply_overrides(config, checked.overrides, CHECKPOINT_SECTIONS)
    if args.chair_table is not None:
        config = replace(config, data=replace(config.data, chair_table=args.chair_table))
    if getattr(args, "pointing_tolerance", None) is not None:
        config = replace(config, data=replace(config.data, pointing_tolerance=args.pointing_tolerance))
    if args.skip_bad_images:
        config = replace(config, data=replace(config.data, skip_bad_images=True))
    return config


def _caption_images(run: _Loaded, records: list[ImageRecord], outputs: EvaluationFiles) -> None:
    """``--images``: every image captioned, the results (and the image index) written, the first
    captions printed (no scores)."""
    tokenizer = run.config.data.tokenizer
    captioned = caption_records(run.model, run.config, records, run.device, run.decode, run.progress)
    _report_skipped(records, captioned)
    notes = outputs.notes()
    write_results(outputs.results, captioned, tokenizer)
    if outputs.ranked is not None:
        write_ranked_results(outputs.ranked, captioned, tokenizer)
    paths = {str(item.record.image_id): str(item.record.path) for item in captioned}
    if outputs.index is not None:
        atomic_write(
            outputs.index,
            lambda p: p.write_text(json.dumps(paths, indent=1), encoding="utf-8", errors="replace"),
        )
    for item in captioned[:10]:
        print(printable(f"{item.record.path.name}: {item.text}"))  # a vocabulary's words are data
        for rank, other in enumerate(item.alternatives, 2):
            print(printable(f"  {rank}. {other.text}"))
    if run.decode.num_return > 1:
        measures = caption_set_scores(
            captioned, tokenizer, with_references=False, strategy=run.decode.strategy
        )
        print("\n".join(caption_set_lines(measures)))
        _warn_fewer(captioned, run.decode.num_return)
    files = {
        "captions": outputs.results,
        "image id -> file": outputs.index,
        "ranked captions": outputs.ranked,
    }
    print_written(files, notes)


def _caption_split(
    args: argparse.Namespace, run: _Loaded, outputs: EvaluationFiles, use_java: bool | None
) -> dict:
    """``--split``: its images captioned, the results written, then scored (and explained with
    ``--faithfulness``), the scores and the faithfulness page written."""
    records = split_records(run.config, args.split, generate=run.generate)
    # Every input before decoding: the boxes are read now, and ground only the images they cover.
    boxes = load_boxes(args.instances or default_instances(run.config))
    study = None
    if run.faithfulness is not None:  # its bootstrap draws, its memory and its baseline before decoding
        study = prepare_study(
            run.faithfulness,
            run.model,
            run.config,
            run.device,
            args,
            len(records),
            run.decode.max_length,
            run.shuffled,
        )
    captioned = caption_records(
        run.model,
        run.config,
        records,
        run.device,
        run.decode,
        run.progress,
        output_dir=outputs.run_dir,
        build_cache=run.build_cache,
    )
    _report_skipped(records, captioned)
    notes = outputs.notes()
    write_results(outputs.results, captioned, run.config.data.tokenizer)  # kept even if scoring fails
    scores = _scores_of(args, run, captioned, boxes, use_java)
    explained: list = []  # each explained image's maps per method, for the page
    if study is not None:
        explained = study.run(scores, captioned, boxes, outputs.run_dir, run.build_cache, args)
    print(scores_text(scores, len(captioned)))
    if run.decode.num_return > 1:  # the first caption was scored above; these measure all n
        _caption_set_measures(scores, captioned, run, outputs.ranked)
    assert outputs.scores is not None  # a split's outputs name its scores file
    scores_path, per_image = write_scores(outputs.scores, scores)
    if outputs.page is not None:
        write_faithfulness_page(
            outputs.page,
            scores,
            explained,
            captioned,
            run.model.grid,
            args.faithfulness_figures,
            run.progress,
            boxes,
        )
    files = {
        "captions": outputs.results,
        "scores": scores_path,
        "per-image scores": per_image,
        "faithfulness page": outputs.page,
        "ranked captions": outputs.ranked,
    }
    print_written(files, notes)
    return scores


def _scores_of(args: argparse.Namespace, run: _Loaded, captioned: list, boxes, use_java: bool | None) -> dict:
    """The decoded split's scores (``score_captioned``), naming the checkpoint they came from."""
    scores = score_captioned(
        captioned,
        run.model.grid,
        boxes,
        use_java=use_java,
        spice=args.spice,
        java_timeout=args.java_timeout,
        decode=run.decode,
        checkpoint=args.checkpoint,
        chair=run.config.data.chair_table,
        reward=run.reward,
        clip_scorer=run.clip_scorer,
        tokenizer=run.config.data.tokenizer,
        tolerance=run.config.data.pointing_tolerance,
    )
    scores["checkpoint"] = str(args.checkpoint)
    return scores


def _caption_set_measures(scores: dict, captioned: list, run: _Loaded, ranked: Path | None) -> None:
    """With several captions an image: all of them written ranked, and the oracle and diversity
    measures of each image's set added to ``scores`` and printed."""
    if ranked is not None:
        write_ranked_results(ranked, captioned, run.config.data.tokenizer)
    scores["caption sets"] = caption_set_scores(
        captioned, run.config.data.tokenizer, strategy=run.decode.strategy
    )
    print(f"the {run.decode.num_return} captions of each image:")
    print("\n".join(caption_set_lines(scores["caption sets"])))
    _warn_fewer(captioned, run.decode.num_return)
