"""The faithfulness study of a captioned split (``evaluate.py --checkpoint C --split S --faithfulness``):
the images' grids (from the feature cache when the split's captions were decoded from it, else through
the encoder), the baseline (:mod:`captioning.explain.baselines`), the study of
:mod:`captioning.explain.study`, and its line in the scores' signature."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from captioning.config import Config
from captioning.data.datasets import ImageOnlyDataset, collate_captions
from captioning.data.images import load_image
from captioning.evaluation.grounding import Instances
from captioning.explain.baselines import BLUR_SIGMA, baseline_hash, blurred_grids, training_mean
from captioning.explain.config import ExplainConfig, signature_part
from captioning.explain.hallucinated_maps import peak_lines
from captioning.explain.pixel_curves import PixelInputs
from captioning.explain.plan import StudyPlan, calibrate, study_plan
from captioning.explain.plausibility import Explained
from captioning.explain.statistics import BootstrapSettings, floor_warning
from captioning.explain.study import faithfulness_study
from captioning.inference.batches import annotations_of, move
from captioning.inference.captioner import Captioned
from captioning.inference.inputs import caption_dataset, uses_cache
from captioning.models.base import CaptionDecoder
from captioning.models.captioner import Captioner
from captioning.utils.errors import InputError


@torch.no_grad()
def split_grids(
    model: Captioner,
    config: Config,
    captioned: Sequence[Captioned],
    device: torch.device,
    output_dir: Path,
    build_cache: bool = True,
    progress: bool = True,
) -> torch.Tensor:
    """(N, P, C) float32 grids of the captioned images, in their order."""
    records = [item.record for item in captioned]
    dataset: Dataset
    if all(r.captions for r in records) and uses_cache(config):
        dataset = caption_dataset(
            records, model, config, device, output_dir, progress, 1, build_cache=build_cache
        )
    else:
        dataset = ImageOnlyDataset(records, model.encoder.transform, config.data.skip_bad_images)
    loader = DataLoader(dataset, batch_size=config.decode.batch_size, collate_fn=collate_captions)
    return torch.cat(
        [annotations_of(model, move(batch, device)).float() for batch in loader if batch is not None]
    )


def shared_baseline(
    model: Captioner,
    config: Config,
    settings: ExplainConfig,
    device: torch.device,
    run_dir: Path | None,
    checkpoint: Path | None = None,
    build_cache: bool = False,
    progress: bool = False,
) -> tuple[torch.Tensor | None, str]:
    """The baseline every image shares, (C,), and its name in the signature; (None, name) for ``blur``,
    whose grids are each image's own (:func:`split_study` encodes them)."""
    if settings.baseline == "zeros":
        return torch.zeros(model.encoder.channels), "zeros"
    if settings.baseline == "blur":
        return None, f"blur{BLUR_SIGMA:.4f}"
    mean = training_mean(model, config, device, run_dir, checkpoint, build_cache, progress)
    return mean, f"dataset_mean.{baseline_hash(mean)}"


def split_study(
    model: Captioner,
    config: Config,
    captioned: Sequence[Captioned],
    device: torch.device,
    settings: ExplainConfig,
    instances: Instances | None,
    output_dir: Path,
    build_cache: bool = True,
    images: int = 0,
    progress: bool = True,
    maps_out: list[Explained] | None = None,
    bootstrap: BootstrapSettings | None = None,
    baseline: torch.Tensor | None = None,
    shuffled: CaptionDecoder | None = None,
) -> dict:
    """The faithfulness table of the first ``images`` (0: all) captioned images of a split;
    ``maps_out``, when given, receives each explained image's maps per method; ``bootstrap``: the
    resampling of its intervals and tests; ``baseline``: the (C,) one of :func:`shared_baseline`,
    None for ``blur`` (each image's blurred grid); ``shuffled``, the decoder of a model trained on
    shuffled captions (:func:`check_shuffled`), adds the data randomisation test."""
    chosen = [item for item in captioned if item.caption.tokens][: images or None]
    grids = split_grids(model, config, chosen, device, output_dir, build_cache, progress)
    if baseline is None:
        paths = [item.record.path for item in chosen]
        readers = [lambda path=path: load_image(path) for path in paths]
        baseline = blurred_grids(model, readers, device, config.decode.batch_size)
    references = {item.record.image_id: [list(tokens) for tokens in item.record.captions] for item in chosen}
    model.eval()
    pixels = split_pixels(model, config, chosen, device) if settings.pixel is not None else None
    plan = planned(model, grids, [item.caption.tokens for item in chosen], settings, pixels)
    print("\n".join(plan.lines()), flush=True)
    result = faithfulness_study(
        model.decoder,
        grids,
        [item.caption.tokens for item in chosen],
        [item.words for item in chosen],
        [item.record.image_id for item in chosen],
        model.grid,
        settings,
        baseline.to(grids.device),
        instances,
        references,
        progress,
        maps_out,
        bootstrap,
        shuffled=shuffled,
        pixels=pixels,
    )
    result["images"] = len(chosen)
    result["plan"] = plan.to_json()
    return result


def check_shuffled(model: Captioner, shuffled: Captioner, config: Config, path: Path) -> None:
    """The model of ``--data-randomised-checkpoint`` fits the data randomisation test of ``model``: trained
    with ``data.shuffle_captions``, on the same vocabulary, encoder (so the same grids) and decoder
    family.

    Raises:
        InputError: one line naming the option, the file and what differs.
    """
    where = f"--data-randomised-checkpoint {path}"
    if not config.data.shuffle_captions:
        raise InputError(
            f"{where}: not trained with data.shuffle_captions=true (its captions were the images' own)"
        )
    if shuffled.vocab != model.vocab:
        raise InputError(
            f"{where}: its vocabulary ({len(shuffled.vocab)} words) is not the checkpoint's "
            f"({len(model.vocab)} words): train it on the same data"
        )
    if shuffled.encoder.fingerprint() != model.encoder.fingerprint():
        raise InputError(
            f"{where}: its encoder ({shuffled.encoder.name}) gives other grids than the checkpoint's"
        )
    if type(shuffled.decoder) is not type(model.decoder):
        raise InputError(
            f"{where}: decoder {type(shuffled.decoder).__name__}, "
            f"the checkpoint's is {type(model.decoder).__name__}"
        )


def split_pixels(
    model: Captioner, config: Config, captioned: Sequence[Captioned], device: torch.device
) -> PixelInputs:
    """The captioned images as the encoder takes them, read a batch at a time, and the encoder."""
    dataset = ImageOnlyDataset([item.record for item in captioned], model.encoder.transform)

    def images(first: int, stop: int) -> torch.Tensor:
        items = [dataset[index] for index in range(first, stop)]
        return torch.stack([item["image"] for item in items if item is not None]).to(device)

    return PixelInputs(model.encode, images, model.grid)


def planned(
    model: Captioner,
    grids: torch.Tensor,
    tokens: Sequence[Sequence[int]],
    settings: ExplainConfig,
    pixels: PixelInputs | None,
) -> StudyPlan:
    """The study's plan with the estimate of a short calibration on its own grids and images."""
    images = pixels.images(0, min(2, len(tokens))) if pixels is not None else None
    size = images.size(-2) * images.size(-1) if images is not None else 0
    plan = study_plan(model.decoder, tokens, grids.size(1), settings, size)
    similarity = (model.grid, settings.similarity_size) if settings.sanity_images else None
    return calibrate(
        plan, model.decoder, grids, tokens, settings.batch_rows, model.encode, images, similarity
    )


def signature_field(settings: ExplainConfig, images: int, baseline: str | None = None) -> str:
    """The study's settings as one signature value (no ``|`` or ``:``): :func:`signature_part`."""
    return signature_part(settings, images, baseline)


def table_lines(result: dict) -> list[str]:
    """The per-method table as console lines: each area with its 95% interval over images, the gaps
    with their Holm-adjusted p-values, then the paired tests that name a more faithful method."""

    def number(value, width: int, digits: int = 3) -> str:
        return f"{value:>{width}.{digits}f}" if isinstance(value, float) else f"{'-':>{width}}"

    def ranged(row: dict, key: str) -> str:
        low, high = row.get(f"{key}_ci") or (None, None)
        bounds = f"[{low:.3f},{high:.3f}]" if isinstance(low, float) and isinstance(high, float) else ""
        return number(row.get(key), 7) + f"{bounds:>16}"

    statistics = result.get("statistics", {})
    random = result["random"]
    lines = [
        f"faithfulness of {result.get('images', '?')} images, {statistics.get('words', '?')} words "
        "(deletion: lower is better; insertion: higher; [95% interval over images]; p Holm of the gap)",
        f"{'method':<22}{'deletion':>23}{'insertion':>23}{'del gap':>9}{'p':>7}{'ins gap':>9}{'p':>7}"
        f"{'rand |r|':>9}{'mass':>7}{'pointing':>9}",
        f"{'random':<22}{ranged(random, 'deletion_auc')}{ranged(random, 'insertion_auc')}",
    ]
    for name, row in result["methods"].items():
        flag = " (flagged)" if row.get("sanity_flagged") else ""
        lines.append(
            f"{name:<22}{ranged(row, 'deletion_auc')}{ranged(row, 'insertion_auc')}"
            f"{number(row.get('deletion_gap'), 9)}{number(row.get('deletion_gap_p_holm'), 7)}"
            f"{number(row.get('insertion_gap'), 9)}{number(row.get('insertion_gap_p_holm'), 7)}"
            f"{number(row.get('sanity_spearman_abs'), 9, 2)}{number(row.get('grounding_mass'), 7, 2)}"
            f"{number(row.get('pointing'), 9, 2)}{flag}"
        )
    for test in result.get("paired", []):
        if test.get("more_faithful"):
            other = test["b"] if test["more_faithful"] == test["a"] else test["a"]
            lines.append(
                f"{test['curve']}: {test['more_faithful']} more faithful than {other} "
                f"(p Holm {test['p_holm']:.4f})"
            )
    if statistics.get("tests") and (warning := floor_warning(statistics["tests"], statistics["resamples"])):
        lines.append(warning)
    lines += peak_lines(result.get("hallucination_peaks", {}))
    if "pixel" in result:
        lines += pixel_lines(result)
    return lines


def pixel_lines(result: dict) -> list[str]:
    """The grid and pixel protocols' areas side by side, and whether they rank the methods alike."""
    pixel = result["pixel"]
    lines = [
        "grid and pixel (RISE) protocols side by side (areas; deletion: lower is better)",
        f"{'method':<22}{'grid del':>9}{'pixel del':>10}{'grid ins':>9}{'pixel ins':>10}",
    ]
    rows = {
        "random": (result["random"], pixel["random"]),
        **{
            name: (row, pixel["methods"][name])
            for name, row in result["methods"].items()
            if name in pixel["methods"]
        },
    }
    for name, (grid, on_pixels) in rows.items():
        lines.append(
            f"{name:<22}{grid['deletion_auc']:>9.3f}{on_pixels['deletion_auc']:>10.3f}"
            f"{grid['insertion_auc']:>9.3f}{on_pixels['insertion_auc']:>10.3f}"
        )
    for curve, agreement in pixel["rank_agreement"].items():
        tau = agreement["kendall_tau"]
        lines.append(
            f"{curve} ranking, grid: {' > '.join(agreement['grid_order'])}; pixel: "
            f"{' > '.join(agreement['pixel_order'])} (Kendall tau {'-' if tau is None else f'{tau:.2f}'})"
        )
    return lines
