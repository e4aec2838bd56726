"""``evaluate.py --faithfulness``: its options checked before any work, the study over a decoded split
and its page."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from captioning.config import Config, ConfigError
from captioning.utils.errors import MissingExtraError
from captioning.utils.extras import extra_message
from captioning.utils.files import writes_in_place


def faithfulness_settings(args: argparse.Namespace):
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


def fitted_methods(settings, requested: str, decoder):
    """The settings with the methods that fit ``decoder``: all that do by default, else the ones named
    (one that does not fit is refused)."""
    from captioning.explain.methods import applicable_methods, parse_methods

    if requested == "default":
        return replace(settings, methods=applicable_methods(decoder))
    return replace(settings, methods=parse_methods(requested, decoder))


def study_baseline(settings, model, config: Config, device, args, words: int) -> tuple:
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


def shuffled_decoder(args: argparse.Namespace, model, device):
    """The decoder of ``--data-randomised-checkpoint`` (None without it), checked against ``model``."""
    path = getattr(args, "data_randomised_checkpoint", None)
    if path is None:
        return None
    from captioning.explain.split import check_shuffled
    from captioning.inference.captioner import load_trained_captioner

    shuffled, shuffled_config, _ = load_trained_captioner(path, device)
    check_shuffled(model, shuffled, shuffled_config, path)
    return shuffled.decoder


def faithfulness_page_path(scores: Path) -> Path | None:
    """``x_scores.json`` -> ``x_faithfulness.html`` beside it; None beside a device or a FIFO."""
    if writes_in_place(scores):
        return None
    return scores.with_name(scores.stem.removesuffix("_scores") + "_faithfulness.html")


def write_faithfulness_page(
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


@dataclass
class PreparedStudy:
    """The study ``--faithfulness`` runs once the split is decoded, everything it needs checked and
    made before decoding: its settings (the methods fitted to the model), its shared baseline (None
    for ``blur``) and the name the table gives it, ``--data-randomised-checkpoint``'s decoder, and the
    model it explains with its configuration and device."""

    settings: Any
    baseline: Any
    baseline_name: str
    shuffled: Any
    model: Any
    config: Config
    device: Any

    def run(
        self, scores: dict, captioned: list, boxes, run_dir: Path, build_cache: bool, args: argparse.Namespace
    ) -> list:
        """The study over the ``captioned`` images, its table printed and added to ``scores``
        (``faithfulness``, and a field of the signature); returns each explained image's maps per
        method, for the page."""
        from captioning.explain.split import signature_field, split_study, table_lines
        from captioning.explain.statistics import BootstrapSettings

        explained: list = []
        study = split_study(
            self.model,
            self.config,
            captioned,
            self.device,
            self.settings,
            boxes,
            run_dir,
            build_cache,
            args.faithfulness_images,
            not args.no_progress,
            explained,
            BootstrapSettings(args.resamples, args.seed),
            self.baseline,
            shuffled=self.shuffled,
        )
        study["baseline"] = self.baseline_name
        scores["faithfulness"] = study
        scores["signature"] += f"|faith:{signature_field(self.settings, study['images'], self.baseline_name)}"
        print("\n".join(table_lines(study)))
        return explained


def prepare_study(
    settings, model, config: Config, device, args: argparse.Namespace, images: int, max_length: int, shuffled
) -> PreparedStudy:
    """Before decoding a split of ``images`` images: the bootstrap's draws over the explained ones and
    the study's memory for their words (at most ``max_length`` each) checked, its baseline made."""
    from captioning.evaluation.compare import check_bootstrap_fits

    explained_images = min(images, args.faithfulness_images or images)
    check_bootstrap_fits(args.resamples, explained_images)  # (R, N) counts drawn at once
    baseline, name = study_baseline(settings, model, config, device, args, explained_images * max_length)
    return PreparedStudy(settings, baseline, name, shuffled, model, config, device)
