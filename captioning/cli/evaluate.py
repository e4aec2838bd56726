"""What ``evaluate.py`` does for each of its uses."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from captioning.cli.common import (
    check_config_extras,
    checkpoint_to_read,
    load_for_tool,
    refuse_export_for_attribution,
)
from captioning.cli.decoding_flags import decode_class, decoding_changes
from captioning.config import MAX_DECODE_LENGTH, Config, ConfigError
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
from captioning.utils.errors import MissingExtraError
from captioning.utils.extras import config_extras, extra_message, preflight
from captioning.utils.files import atomic_write, not_a_regular_file, output_note, same_file, writes_in_place
from captioning.utils.output_paths import check_outputs
from captioning.utils.run_folder import (
    evaluation_prefix,
    run_folder_of,
    scores_path_for,
)
from captioning.utils.text import printable


def _print_summary(files: dict[str, Path | None], notes: dict[Path, str]) -> None:
    """The files written, each with what writing it did there; None entries were not written."""
    print("wrote:")
    for what, path in files.items():
        if path is not None:
            print(f"  {what:<22} {path}" + notes.get(path, ""))


def _notes(*paths: Path | None) -> dict[Path, str]:
    """What each write is about to do to what stands at its path (``output_note``), for the summary."""
    return {path: output_note(path) for path in paths if path is not None}


def _beside(results: Path, suffix: str) -> Path | None:
    """``x_results.json`` -> ``x<suffix>``, a file written beside the results file; None beside a
    device or a FIFO (/dev/null, a pipe)."""
    if writes_in_place(results):
        return None
    return results.with_name(results.stem.removesuffix("_results") + suffix)


def _outputs(*named: tuple[str, Path | None]) -> list[tuple[str, Path]]:
    """The (option, path) of the files a command writes, leaving out those it writes none of (None)."""
    return [(option, path) for option, path in named if path is not None]


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


def _compare_or_aggregate(args: argparse.Namespace, use_java: bool | None) -> dict:
    """``--compare A B --annotations REFS`` or ``--aggregate SCORES...`` (nothing is decoded).

    Only ``--out``, when given, is written: it is checked before any file is read, and may not be
    one of the inputs.
    """
    if args.checkpoint is not None or args.images is not None or args.results is not None:
        raise ConfigError(
            "--compare and --aggregate read existing files: give no --checkpoint/--images/--results"
        )
    if args.aggregate and args.compare:
        raise ConfigError("give one of --compare or --aggregate")
    if args.aggregate and (args.annotations is not None or args.instances):
        option = "--annotations" if args.annotations is not None else "--instances"
        raise ConfigError(
            f"{option}: not used by --aggregate (it reads the runs' scores files); leave it out"
        )
    results_a, results_b = _compare_groups(args) if args.compare else ([], [])
    option = "--compare" if args.compare else "--aggregate"
    inputs = [
        *((option, path) for path in args.compare or args.aggregate),
        *(("--compare (its scores)", scores_path_for(path)) for path in args.compare or ()),
        *(("--against", path) for path in getattr(args, "against", None) or ()),
        ("--annotations", args.annotations),
        *(("--aggregate", path.parent / "config.yaml") for path in args.aggregate or ()),
    ]
    if args.out is not None:
        check_outputs([("--out", args.out)], inputs)
    if args.aggregate:
        from captioning.evaluation.aggregate import aggregate_command
        from captioning.explain.seeds import seeds_section

        sections = {"faithfulness": seeds_section(args.resamples, args.seed)}
        return aggregate_command(args.aggregate, args.out, sections)
    if args.annotations is None:
        raise ConfigError("--compare needs --annotations (the reference captions of both systems' images)")
    from captioning.evaluation.compare import compare_command

    boxes = load_boxes(args.instances) if args.instances else None  # CHAIR of every run, from its captions
    from captioning.explain.compare import check_comparable, faithfulness_of

    # every run's faithfulness table read and checked before any caption is scored
    tables = [faithfulness_of(path) for path in results_a], [faithfulness_of(path) for path in results_b]
    check_comparable(*tables, [*results_a, *results_b], args.resamples)
    comparison = compare_command(
        args.annotations,
        results_a,
        results_b,
        args.out,
        use_java,
        args.spice,
        args.resamples,
        args.seed,
        args.java_timeout,
        getattr(args, "names", None),
        boxes,
        tokenizer=args.tokenizer,
        chair=args.chair_table or "released",
    )
    _compare_faithfulness(*tables, args, comparison)
    return comparison


def _compare_faithfulness(a: list, b: list, args: argparse.Namespace, comparison: dict) -> None:
    """The faithfulness rows of the systems' scores (each run's table or None, one run a side or
    several), when every run's scores hold them: printed, and added to ``--out``'s comparison."""
    from captioning.evaluation.significance import comparison_table
    from captioning.explain.compare import faithfulness_comparison

    tables_a, tables_b = [t for t in a if t is not None], [t for t in b if t is not None]
    if len(tables_a) < len(a) or len(tables_b) < len(b):
        if tables_a or tables_b:  # some runs explained, not all: say why no rows
            print("faithfulness of the maps: not compared, the scores of some runs hold no table")
        return
    rows, images = faithfulness_comparison(tables_a, tables_b, args.resamples, args.seed)
    if not rows:
        return
    names = (comparison["names"]["a"], comparison["names"]["b"])
    both = "by both" if len(a) == len(b) == 1 else f"by all {len(a) + len(b)} runs"
    print(
        f"faithfulness of the maps, {images} images explained {both} "
        "(areas: the mean over their words, x100; deletion: lower is faithful; p Holm: over these rows)"
    )
    print(comparison_table(rows, names))
    comparison["faithfulness"] = {name: row.to_json() for name, row in rows.items()}
    if args.out is not None:
        overall = {k: v for k, v in comparison.items() if k != "table"}
        atomic_write(args.out, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))


def _compare_groups(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    """``--compare A B`` (one run a side) or ``--compare A1 A2 ... --against B1 B2 ...`` (seeds a side)."""
    against = getattr(args, "against", None)
    if against is None:
        if len(args.compare) != 2:
            raise ConfigError(
                f"--compare takes two results files (A B), got {len(args.compare)}; to compare "
                "several runs a side give A's after --compare and B's after --against"
            )
        if same_file(*args.compare):
            raise ConfigError(
                f"--compare: {args.compare[0]} and {args.compare[1]} are the same file; give two "
                "systems' results"
            )
        return [args.compare[0]], [args.compare[1]]
    runs = [*args.compare, *against]
    for index, path in enumerate(runs):
        if any(
            same_file(path, earlier) or Path(path).resolve() == Path(earlier).resolve()
            for earlier in runs[:index]
        ):
            raise ConfigError(f"{path}: given twice: each run counts once")
    return list(args.compare), list(against)


def _faithfulness_settings(args: argparse.Namespace):
    """``--faithfulness`` and its options checked before any work (None without it)."""
    if getattr(args, "faithfulness", None) is None:
        return None
    if args.split is None:
        raise ConfigError(
            "--faithfulness explains the captions of a split: give it with --checkpoint and --split"
        )
    from captioning.explain import METHODS
    from captioning.explain import config as explain_config
    from captioning.explain.methods import check_extras, parse_methods

    for flag in ("faithfulness_images", "faithfulness_figures"):
        if getattr(args, flag, 0) < 0:
            option = "--" + flag.replace("_", "-")
            raise ConfigError(f"{option} must be 0 or more, got {getattr(args, flag)}")
    methods = METHODS.names() if args.faithfulness == "default" else parse_methods(args.faithfulness)
    from captioning.evaluation.compare import check_bootstrap_options

    check_bootstrap_options(args.resamples, args.seed)  # the table's intervals and tests
    check_extras(methods, "--faithfulness")  # before the model is read or a caption decoded
    # the class the parser's flags came from (get_args_parser reads the same attribute)
    settings = explain_config.config_from_flags(args, explain_config.ExplainConfig, methods=methods)
    if getattr(args, "data_randomised_checkpoint", None) is not None and settings.sanity_images == 0:
        raise ConfigError(
            "--data-randomised-checkpoint compares the maps of the sanity images: "
            "give --sanity-images 1 or more"
        )
    if settings.sanity_images and not _importable("skimage"):  # the randomisation tests' SSIM and HOG
        raise MissingExtraError(extra_message("explain", "--sanity-images (SSIM and HOG)", ["skimage"]))
    return settings


def _importable(module: str) -> bool:
    """Whether ``import module`` can find it, without importing it (None in ``sys.modules`` blocks it)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _fitted_methods(settings, requested: str, decoder):
    """The settings with the methods that fit ``decoder``: all that do by default, else the ones named
    (one that does not fit is refused)."""
    from captioning.explain.methods import applicable_methods, parse_methods

    if requested == "default":
        return replace(settings, methods=applicable_methods(decoder))
    return replace(settings, methods=parse_methods(requested, decoder))


def _study_baseline(settings, model, config: Config, device, args, words: int) -> tuple:
    """The faithfulness study's memory for at most ``words`` words checked, and its shared baseline
    with its name, before any decoding: the training mean is read back from the run folder or computed
    now (from the feature cache when there is one; none is built for it)."""
    from captioning.explain.cost import check_explain_fits
    from captioning.explain.split import shared_baseline

    check_explain_fits(settings, model.grid[0] * model.grid[1], model.encoder.channels, words, device)
    checkpoint = Path(args.checkpoint)
    run = (
        checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    )  # <run>/checkpoints/x.pt
    return shared_baseline(model, config, settings, device, run, checkpoint, False, not args.no_progress)


def _shuffled_decoder(args: argparse.Namespace, model, device):
    """The decoder of ``--data-randomised-checkpoint`` (None without it), checked against ``model``."""
    path = getattr(args, "data_randomised_checkpoint", None)
    if path is None:
        return None
    from captioning.explain.split import check_shuffled
    from captioning.inference.captioner import load_trained_captioner

    shuffled, shuffled_config, _ = load_trained_captioner(path, device)
    check_shuffled(model, shuffled, shuffled_config, path)
    return shuffled.decoder


def _scores_paths(out: Path | None, results: Path) -> Path:
    return out if out is not None else scores_path_for(results)


def _faithfulness_page_path(scores: Path) -> Path | None:
    """``x_scores.json`` -> ``x_faithfulness.html`` beside it; None beside a device or a FIFO."""
    if writes_in_place(scores):
        return None
    return scores.with_name(scores.stem.removesuffix("_scores") + "_faithfulness.html")


def _write_faithfulness_page(
    page: Path,
    scores: dict,
    explained: list,
    captioned: list,
    grid: tuple[int, int],
    figures: int,
    progress: bool,
    boxes=None,
) -> Path:
    """The faithfulness page of ``scores`` with the maps of the first ``figures`` explained images (and
    the boxes of the objects each word names, when ``boxes`` cover the image)."""
    from captioning.data.images import load_image
    from captioning.evaluation.grounding import WordMatcher, word_boxes
    from captioning.visualization.faithfulness_page import ExplainedImage, write_faithfulness_page

    records = {item.record.image_id: item.record for item in captioned}
    areas = {row["image_id"]: row for row in scores["faithfulness"].get("per_image", [])}
    matcher = WordMatcher()  # one table of category words for every image
    items = [
        ExplainedImage(
            one.image_id,
            Path(records[one.image_id].path).name,
            one.words,
            one.maps,
            areas.get(one.image_id, {}),
            word_boxes(one.words, one.image_id, boxes, matcher),
        )
        for one in explained[:figures]
    ]
    return write_faithfulness_page(
        page,
        scores["faithfulness"],
        items,
        [load_image(records[item.image_id].path) for item in items],
        grid,
        checkpoint=scores.get("checkpoint"),
        signature=scores.get("signature", ""),
        progress=progress,
    )


def evaluate(args: argparse.Namespace) -> dict | None:
    """Dispatch on the arguments of ``evaluate.py``; returns the scores when some were computed."""
    use_java = False if args.no_java else None
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
    if getattr(args, "aggregate", None) or getattr(args, "compare", None):
        return _compare_or_aggregate(args, use_java)
    if getattr(args, "clip_score", None) is not None and (args.checkpoint is None or args.split is None):
        raise ConfigError("--clip-score scores the images of a split: give it with --checkpoint and --split")
    if args.annotations is not None:
        if args.results is None or args.checkpoint is not None or args.images is not None:
            raise ConfigError(
                "--annotations scores an existing file: give --results and no --checkpoint/--images"
            )
        if not args.results.is_file():
            raise ConfigError(
                f"{args.results}: {not_a_regular_file(args.results) or 'results file not found'}"
            )
        scores_path = _scores_paths(args.out, args.results)
        check_outputs(
            _outputs(("--out", scores_path), ("--out (per-image scores)", per_image_path(scores_path))),
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
        notes = _notes(scores_path, per_image_path(scores_path))
        scores_path, per_image = write_scores(scores_path, scores)
        _print_summary({"scores": scores_path, "per-image scores": per_image}, notes)
        return scores

    if args.checkpoint is None:
        raise ConfigError("give --checkpoint (with --split or --images), or --annotations with --results")
    faithfulness = _faithfulness_settings(args)
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
    # Cheap checks first, so that a typo fails in a moment rather than after loading the model.
    check_overrides(overrides, CHECKPOINT_SECTIONS)
    # Each flag's own range now; what depends on the checkpoint's options (num_return and
    # beam_groups against its beam_size, min_length against its max_length) is checked once it is loaded.
    early = {
        "beam_size": (args.num_return or 1) * (args.beam_groups or 1)
        if args.beam_size is None
        else args.beam_size,
        "max_length": MAX_DECODE_LENGTH if args.max_length is None else args.max_length,
    }
    decode_config_with(decode_class()(), **{**decoding, **early})
    records = read_folder(args.images) if args.images is not None else None
    # Only the data section is read: a run's config.yaml of any version is taken (stored=True).
    data_config = load_config(args.config, stored=True).data if args.config is not None else None
    dataset = overrides.get("data.dataset") or (data_config.dataset if data_config is not None else None)
    if dataset is not None:  # the checkpoint's own is checked where it is first read
        DATASETS.check(dataset)
    tokenizer = overrides.get("data.tokenizer") or (data_config.tokenizer if data_config else None)
    preflight(config_extras(tokenizer=tokenizer, dataset=dataset if records is None else None))
    # Outputs go to the run folder the checkpoint sits in (<run>/checkpoints/x.pt), else the current one,
    # under names of evaluate.py's own that never replace the main job's test_results.json & co.
    run_dir = run_folder_of(args.checkpoint)
    prefix = evaluation_prefix(args.checkpoint, "images" if records is not None else args.split)
    results = args.results or run_dir / f"{prefix}_results.json"
    page: Path | None = None  # the faithfulness page, with --faithfulness
    if records is not None:
        index = _beside(results, "_files.json")
        outputs = _outputs(("--results", results), ("--results (image id -> file)", index))
    else:
        scores_target = _scores_paths(args.out, results)
        if faithfulness is not None:
            page = _faithfulness_page_path(scores_target)
        outputs = _outputs(
            ("--results", results),
            ("--out", scores_target),
            ("--out (per-image scores)", per_image_path(scores_target)),
            ("--out (faithfulness page)", page),
        )
    inputs = [
        ("--checkpoint", args.checkpoint),
        ("--config", args.config),
        ("--data-randomised-checkpoint", getattr(args, "data_randomised_checkpoint", None)),
        *(("--instances", path) for path in args.instances or ()),
        *(("--images", record.path) for record in records or ()),
    ]
    check_outputs(outputs, inputs)
    output_paths = [path for _, path in outputs]
    device = resolve_device(args.device)
    clip_scorer = None
    # its weights before any decoding: a missing file stops now
    if getattr(args, "clip_score", None) is not None:
        from captioning.evaluation.clip_score import load_clip_scorer

        clip_scorer = load_clip_scorer(args.clip_score, device=device)
    model, config, reward, device = load_for_tool(args.checkpoint, args.device)
    shuffled = _shuffled_decoder(args, model, device)  # checked before any decoding
    if data_config is not None:
        config = with_data_section(config, data_config)
    config = apply_overrides(config, overrides, CHECKPOINT_SECTIONS)
    if args.chair_table is not None:
        config = replace(config, data=replace(config.data, chair_table=args.chair_table))
    if getattr(args, "pointing_tolerance", None) is not None:
        config = replace(config, data=replace(config.data, pointing_tolerance=args.pointing_tolerance))
    if args.skip_bad_images:
        config = replace(config, data=replace(config.data, skip_bad_images=True))
    # the checkpoint's own tokenizer (scoring) and dataset (a split), before any image is read
    check_config_extras(config, encoder=False, dataset=records is None)
    if faithfulness is not None:
        faithfulness = replace(
            _fitted_methods(faithfulness, args.faithfulness, model.decoder),
            pointing_tolerance=config.data.pointing_tolerance,
            similarity_size=config.model.encoder.image_size,
        )

    decode_config = decode_config_with(config, **decoding)
    # Every caption of every image, ranked, beside the results file when several are asked for
    # (by a flag, --set or the checkpoint's own decode.num_return).
    ranked = _beside(results, "_ranked.json") if decode_config.num_return > 1 else None
    if ranked is not None:
        outputs.append(("--results (every caption, ranked)", ranked))
        check_outputs(outputs, inputs)
        output_paths.append(ranked)
    progress = not args.no_progress
    generate, build_cache = _user_chose_paths(args, overrides, config)

    if records is not None:
        captioned = caption_records(model, config, records, device, decode_config, progress)
        _report_skipped(records, captioned)
        notes = _notes(*output_paths)
        write_results(results, captioned, config.data.tokenizer)
        if ranked is not None:
            write_ranked_results(ranked, captioned, config.data.tokenizer)
        paths = {str(item.record.image_id): str(item.record.path) for item in captioned}
        if index is not None:
            atomic_write(
                index, lambda p: p.write_text(json.dumps(paths, indent=1), encoding="utf-8", errors="replace")
            )
        for item in captioned[:10]:
            print(printable(f"{item.record.path.name}: {item.text}"))  # a vocabulary's words are data
            for rank, other in enumerate(item.alternatives, 2):
                print(printable(f"  {rank}. {other.text}"))
        if decode_config.num_return > 1:
            measures = caption_set_scores(
                captioned, config.data.tokenizer, with_references=False, strategy=decode_config.strategy
            )
            print("\n".join(caption_set_lines(measures)))
            _warn_fewer(captioned, decode_config.num_return)
        _print_summary({"captions": results, "image id -> file": index, "ranked captions": ranked}, notes)
        return None

    records = split_records(config, args.split, generate=generate)
    # Every input before decoding: the boxes are read now, and ground only the images they cover.
    boxes = load_boxes(args.instances or default_instances(config))
    if faithfulness is not None:  # its bootstrap draws, its memory and its baseline before decoding
        from captioning.evaluation.compare import check_bootstrap_fits

        explained_images = min(len(records), args.faithfulness_images or len(records))
        check_bootstrap_fits(args.resamples, explained_images)  # (R, N) counts drawn at once
        baseline = _study_baseline(
            faithfulness, model, config, device, args, explained_images * decode_config.max_length
        )
    captioned = caption_records(
        model, config, records, device, decode_config, progress, output_dir=run_dir, build_cache=build_cache
    )
    _report_skipped(records, captioned)
    notes = _notes(*output_paths)
    write_results(
        results, captioned, config.data.tokenizer
    )  # before scoring: a long decode is kept even if scoring fails
    scores = score_captioned(
        captioned,
        model.grid,
        boxes,
        use_java=use_java,
        spice=args.spice,
        java_timeout=args.java_timeout,
        decode=decode_config,
        checkpoint=args.checkpoint,
        chair=config.data.chair_table,
        reward=reward,
        clip_scorer=clip_scorer,
        tokenizer=config.data.tokenizer,
        tolerance=config.data.pointing_tolerance,
    )
    scores["checkpoint"] = str(args.checkpoint)
    explained: list = []  # each explained image's maps per method, for the page
    if faithfulness is not None:
        from captioning.explain.split import signature_field, split_study, table_lines
        from captioning.explain.statistics import BootstrapSettings

        shared, baseline_name = baseline
        study = split_study(
            model,
            config,
            captioned,
            device,
            faithfulness,
            boxes,
            run_dir,
            build_cache,
            args.faithfulness_images,
            progress,
            explained,
            BootstrapSettings(args.resamples, args.seed),
            shared,
            shuffled=shuffled,
        )
        study["baseline"] = baseline_name
        scores["faithfulness"] = study
        scores["signature"] += f"|faith:{signature_field(faithfulness, study['images'], baseline_name)}"
        print("\n".join(table_lines(study)))
    print(scores_text(scores, len(captioned)))
    if decode_config.num_return > 1:  # the first caption was scored above; these measure all n
        if ranked is not None:
            write_ranked_results(ranked, captioned, config.data.tokenizer)
        scores["caption sets"] = caption_set_scores(
            captioned, config.data.tokenizer, strategy=decode_config.strategy
        )
        print(f"the {decode_config.num_return} captions of each image:")
        print("\n".join(caption_set_lines(scores["caption sets"])))
        _warn_fewer(captioned, decode_config.num_return)
    scores_path, per_image = write_scores(scores_target, scores)
    if page is not None:
        _write_faithfulness_page(
            page, scores, explained, captioned, model.grid, args.faithfulness_figures, progress, boxes
        )
    _print_summary(
        {
            "captions": results,
            "scores": scores_path,
            "per-image scores": per_image,
            "faithfulness page": page,
            "ranked captions": ranked,
        },
        notes,
    )
    return scores
