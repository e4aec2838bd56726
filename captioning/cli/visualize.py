"""What ``visualize.py`` does: caption images with a checkpoint, draw their attention, write a report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captioning.cli.common import (
    check_config_extras,
    checkpoint_to_read,
    load_for_tool,
    refuse_export_for_attribution,
)
from captioning.cli.decoding_flags import check_decoding_values
from captioning.config import Config
from captioning.config.loading import (
    CHECKPOINT_SECTIONS,
    apply_overrides,
    check_overrides,
    load_config,
    parse_overrides,
    with_data_section,
)
from captioning.data.images import load_image
from captioning.data.records import ImageRecord
from captioning.utils.errors import InputError
from captioning.utils.files import output_note
from captioning.utils.output_paths import check_output_folder, check_outputs
from captioning.utils.text import printable
from captioning.visualization.views import FORMATS, MODES, NORMALIZATIONS, attention_view, check_layer_choice

if TYPE_CHECKING:
    from captioning.inference.captioner import Captioned


@dataclass
class VisualizationResult:
    """What ``visualize_images`` produced.

    Attributes:
        captioned: the decoded images, in input order.
        figures: one figure file per decoded image, same order.
        panels: panels of each figure (1 + words).
        report: the HTML report, when one was asked for.
    """

    captioned: list[Captioned]
    figures: list[Path]
    panels: list[int]
    report: Path | None = None
    notes: dict[Path, str] = field(default_factory=dict)  # what writing each file did there (``output_note``)
    asked: int = 1  # captions asked for per image (decode.num_return)

    def warning(self) -> str | None:
        """One line when some images got fewer captions than ``asked`` (``fewer_captions_warning``)."""
        from captioning.inference.captioner import fewer_captions_warning

        return fewer_captions_warning(self.captioned, self.asked)

    def summary(self) -> str:
        """Each image's caption, then every file written (and which replaced an earlier one)."""
        lines = []
        for item in self.captioned:  # a file name's and a vocabulary's characters are data: printed escaped
            lines.append(printable(f"{Path(item.record.path).name}: {item.text or '(empty caption)'}"))
            lines.extend(
                printable(f"  {rank}. {other.text or '(empty caption)'}")
                for rank, other in enumerate(item.alternatives, 2)
            )
        lines.append("wrote:")
        lines.extend(f"  figure       {path}{self.notes.get(path, '')}" for path in self.figures)
        if self.report is not None:
            lines.append(f"  HTML report  {self.report}{self.notes.get(self.report, '')}")
        return "\n".join(lines)


def visualization_config(
    config: Config,
    data_config: str | Path | None = None,
    overrides: Sequence[str] = (),
    beam_size: int | None = None,
    num_return: int | None = None,
    decoding: Mapping[str, Any] | None = None,
) -> Config:
    """A checkpoint's configuration, adjusted for visualizing.

    Decoding is beam search with the checkpoint's options unless overridden. ``data_config`` takes
    the ``data`` section from another YAML file; ``overrides`` are ``KEY=VALUE`` strings on
    ``data.*`` and ``decode.*`` keys; ``decoding`` (a ``decode.*`` field name -> value, None for
    not given: the tool's flags), then ``beam_size`` and ``num_return``, win over both.

    Raises:
        ConfigError: a malformed or non-overridable key, or an invalid value.
    """
    if data_config is not None:
        # Only the data section is read: a run's config.yaml of any version is taken (stored=True).
        config = with_data_section(config, load_config(data_config, stored=True).data)
    values: dict[str, Any] = {"decode.strategy": "beam", **parse_overrides(overrides)}
    values.update({f"decode.{key}": value for key, value in (decoding or {}).items() if value is not None})
    if beam_size is not None:
        values["decode.beam_size"] = beam_size
    if num_return is not None:
        values["decode.num_return"] = num_return
    return apply_overrides(config, values, sections=CHECKPOINT_SECTIONS)


def _unique_stems(paths: Sequence[Path]) -> list[str]:
    """File stems, with ``-1``, ``-2`` ... added where inputs share one (ignoring letter case), and
    never a name another input already has: ``a/cat.jpg``, ``b/Cat.jpg``, ``cat-2.png`` -> ``cat-1``,
    ``Cat-3``, ``cat-2``."""
    totals = Counter(p.stem.casefold() for p in paths)
    taken = {p.stem.casefold() for p in paths if totals[p.stem.casefold()] == 1}  # unique stems keep theirs
    names = []
    for path in paths:
        name, number = path.stem, 1
        if totals[path.stem.casefold()] > 1:
            while (name := f"{path.stem}-{number}").casefold() in taken:
                number += 1
            taken.add(name.casefold())
        names.append(name)
    return names


def visualize_images(
    checkpoint: str | Path,
    images: Sequence[str | Path] = (),
    *,
    split: str | None = None,
    num: int = 20,
    data_config: str | Path | None = None,
    overrides: Sequence[str] = (),
    out_dir: str | Path = "visualizations",
    mode: str = "bilinear",
    file_format: str = "png",
    html: str | Path | None = None,
    beam_size: int | None = None,
    num_return: int | None = None,
    decoding: Mapping[str, Any] | None = None,
    device: str = "auto",
    layer: str | int | None = None,
    head: str | int | None = None,
    progress: bool = True,
    normalize: str = "figure",
    cmap: str = "viridis",
    methods: str | None = None,
) -> VisualizationResult:
    """Caption images with a checkpoint and draw one attention figure per image.

    Either ``images`` (files of any size, aspect ratio or colour mode) or ``split`` (the first
    ``num`` images of that split of the checkpoint's dataset, or of ``data_config``'s; their
    reference captions are printed under the figures). All images are decoded in batches.

    Args:
        checkpoint: a checkpoint written by ``train.py``.
        out_dir: figure folder; files are ``<image stem>.<format>``, ``-1``, ``-2`` ... added where
            stems repeat (``<image id>`` for a split).
        mode: ``bilinear`` or ``gaussian`` attention upsampling.
        file_format: ``png``, ``pdf`` or ``svg``.
        html: also write the interactive HTML report there.
        beam_size, decoding: the beam size, and any ``decode.*`` field by name (None: the checkpoint's).
        num_return: captions per image (``decode.num_return``): the figures draw the first one's
            attention and list the others, ranked, under it; the summary prints them all.
        layer, head: the attention map drawn (see ``attention_view``): a decoder layer and head
            (1-based) or ``mean``; by default the mean over the heads of the last layer. The
            figures and the report say which map they show.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        normalize: the colour scale: ``figure`` (every word of a figure on one scale, 0 to its
            largest weight, with a colour bar), ``absolute`` (0 to 1) or ``word`` (each map to its
            own peak, the old view: a flat map then looks as hot as a sharp one).
        cmap: a matplotlib colour map (default viridis, perceptually uniform).
        methods: attribution methods (``"attention,gradcam"``, names of ``captioning.explain.METHODS``):
            each figure then has one row per method, each on its own colour scale
            (``captioning.visualization.method_figures``).
    With ``split``, each word that names an annotated object of the dataset's instances
    (``data.instances``; Shapes: its own) has that object's box drawn on its panel (on every method's
    panel with ``methods``).

    Raises:
        ImageError: an image is missing or unreadable (one line naming it).
        CheckpointError: the checkpoint is missing or invalid.
        ValueError / ConfigError: contradictory or invalid options.
    """
    _check_options(images, split, num, mode, normalize, cmap, file_format, overrides, methods)
    named = {"beam_size": beam_size, "num_return": num_return}
    check_decoding_values({**(decoding or {}), **{k: v for k, v in named.items() if v is not None}})
    view = attention_view(layer, head)
    checkpoint, paths = _checked_files(checkpoint, images, out_dir, file_format, html, methods)
    # Only now the heavy imports (torch, torchvision, matplotlib): bad input fails in a moment.
    from captioning.inference.captioner import caption_records

    model, config, _, torch_device = load_for_tool(checkpoint, device)
    label = _show_attention_view(model, config, view, layer, checkpoint)
    if methods is not None:
        from captioning.explain.methods import parse_methods

        methods = ",".join(parse_methods(methods, model.decoder))
    config = visualization_config(config, data_config, overrides, beam_size, num_return, decoding)
    check_config_extras(config, encoder=False, tokenizer=False, dataset=split is not None)
    records, boxes, names = _records_to_draw(config, split, num, paths, data_config, overrides)
    # A handful of images: decode them straight from the files rather than building a feature cache.
    decode_from_images = replace(config, data=replace(config.data, use_cache=False))
    captioned = caption_records(model, decode_from_images, records, torch_device, config.decode, progress)
    if names is not None:  # each decoded image's own name, in the order of the captions
        position = {record.image_id: k for k, record in enumerate(records)}
        names = [names[position[item.record.image_id]] for item in captioned]
    stems = names if names is not None else [str(item.record.image_id) for item in captioned]
    drawing = _Drawing(out_dir, file_format, mode, normalize, cmap, html, progress, boxes)
    notes = {path: output_note(path) for path in drawing.paths(stems)}
    if methods is not None:
        written = _method_figures(model, decode_from_images, captioned, methods, checkpoint, stems, drawing)
    else:
        written = drawing.attention_figures(captioned, model.grid, names, label)
    report = drawing.report(captioned, model.grid, label)
    return VisualizationResult(
        captioned,
        [path for path, _ in written],
        [panels for _, panels in written],
        report,
        notes,
        config.decode.num_return,
    )


def _check_options(
    images: Sequence[str | Path],
    split: str | None,
    num: int,
    mode: str,
    normalize: str,
    cmap: str,
    file_format: str,
    overrides: Sequence[str],
    methods: str | None,
) -> None:
    """The options of ``visualize_images`` that need no file, each refused on one line naming it."""
    if bool(images) == (split is not None):
        raise InputError("give IMAGE files or --split, not both" if images else "give IMAGE files or --split")
    if num < 1:
        raise InputError(f"--num must be >= 1, got {num}")
    if mode not in MODES:
        raise InputError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if normalize not in NORMALIZATIONS:
        raise InputError(f"--normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
    import matplotlib

    if cmap not in matplotlib.colormaps:
        raise InputError(f"--cmap: unknown matplotlib colour map {cmap!r} (e.g. viridis, magma, jet)")
    if file_format not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {file_format!r}")
    check_overrides(parse_overrides(overrides), CHECKPOINT_SECTIONS)
    if methods is not None:
        from captioning.explain.methods import parse_methods

        parse_methods(methods)  # the names, before any work; whether they fit the model once it is loaded


def _checked_files(
    checkpoint: str | Path,
    images: Sequence[str | Path],
    out_dir: str | Path,
    file_format: str,
    html: str | Path | None,
    methods: str | None,
) -> tuple[Path, list[Path]]:
    """The checkpoint to read and the image paths, once the outputs are checked against them (none may
    replace an input) and every image is read, before the model is loaded."""
    check_output_folder(out_dir, "--out-dir")
    checkpoint = checkpoint_to_read(checkpoint)
    if methods is not None:
        refuse_export_for_attribution(checkpoint, "--method")
    paths = [Path(p) for p in images]
    figures = [("--out-dir", Path(out_dir) / f"{stem}.{file_format}") for stem in _unique_stems(paths)]
    check_outputs(
        [*([("--html", html)] if html is not None else []), *figures],
        [("--checkpoint", checkpoint), *(("IMAGE", path) for path in paths)],
    )
    for path in paths:  # fail before loading the model, naming the file
        load_image(path)
    return checkpoint, paths


def _show_attention_view(model, config: Config, view, layer: str | int | None, checkpoint: Path) -> str:
    """The decoder set to draw ``view`` (a layer and head of its attention), checked against the
    model; returns the view's label for the figures."""
    check_layer_choice(model.decoder, config.model.decoder.kind, "--layer", layer)
    try:
        model.decoder.set_attention_view(view)  # before decoding: the captions' maps are this view's
    except ValueError as error:
        raise InputError(f"{checkpoint}: {error}") from None
    return model.decoder.describe_attention()


def _records_to_draw(
    config: Config,
    split: str | None,
    num: int,
    paths: list[Path],
    data_config: str | Path | None,
    overrides: Sequence[str],
) -> tuple[list[ImageRecord], Any, list[str] | None]:
    """(records, boxes, names): the first ``num`` images of ``split`` with its instances' boxes, or the
    image files as records, named by their unique stems (None for a split: its images go by id)."""
    from captioning.evaluation.runner import default_instances, load_boxes
    from captioning.inference.captioner import split_records

    if split is not None:
        # Shapes is generated only under a data.root the user gave, never under the checkpoint's.
        generate = data_config is not None or "data.root" in parse_overrides(overrides)
        records = split_records(config, split, generate=generate)[:num]
        return records, load_boxes(default_instances(config)), None
    records = [ImageRecord(image_id=k, path=path, split="") for k, path in enumerate(paths, start=1)]
    return records, None, _unique_stems(paths)


@dataclass(frozen=True)
class _Drawing:
    """How ``visualize_images`` draws the attention: the figures' folder, format and colours, the
    report's path (None: no report) and the boxes of a split's instances."""

    out_dir: str | Path
    file_format: str
    mode: str
    normalize: str
    cmap: str
    html: str | Path | None
    progress: bool
    boxes: Any

    def paths(self, stems: Sequence[str]) -> list[Path]:
        """Every file drawing writes: a figure per stem, then the report."""
        figures = [Path(self.out_dir) / f"{stem}.{self.file_format}" for stem in stems]
        return [*figures, *([Path(self.html)] if self.html is not None else [])]

    def attention_figures(
        self, captioned: list, grid: tuple[int, int], names: list[str] | None, label: str
    ) -> list[tuple[Path, int]]:
        """One attention figure per image: (path, panels)."""
        from captioning.visualization.report import write_figures

        return write_figures(
            captioned,
            self.out_dir,
            grid,
            self.mode,
            "." + self.file_format,
            names,
            self.progress,
            label,
            normalize=self.normalize,
            cmap=self.cmap,
            boxes=self.boxes,
        )

    def report(self, captioned: list, grid: tuple[int, int], label: str) -> Path | None:
        """The HTML report, when one is asked for."""
        if self.html is None:
            return None
        from captioning.visualization.report import write_report

        return write_report(
            captioned,
            self.html,
            grid,
            self.mode,
            cmap=self.cmap,
            attention_label=label,
            normalize=self.normalize,
            boxes=self.boxes,
        )


def _method_figures(
    model,
    config,
    captioned,
    methods: str,
    checkpoint,
    stems: Sequence[str],
    drawing: _Drawing,
) -> list[tuple[Path, int]]:
    """One figure per image with a row per attribution method: (path, panels) per image. The baseline
    is the training split's mean grid feature (kept in the run folder, as ``evaluate.py --faithfulness``
    keeps it), or a zero feature when the training split cannot be read (said on a line). With
    ``drawing.boxes`` (a split's instances), each word's panels outline the objects it names."""
    from captioning.data.images import load_image
    from captioning.evaluation.grounding import WordMatcher, word_boxes
    from captioning.explain.captions import explain_captions
    from captioning.explain.config import ExplainConfig
    from captioning.explain.methods import needs_baseline
    from captioning.explain.split import shared_baseline, split_grids
    from captioning.visualization.figures import save_figure
    from captioning.visualization.method_figures import method_figure

    names = tuple(methods.split(","))
    device = next(model.decoder.parameters()).device
    grids = split_grids(model, config, captioned, device, Path("."), build_cache=False, progress=False)
    tokens = [item.caption.tokens for item in captioned]
    settings = ExplainConfig(methods=names)
    run = Path(checkpoint).parent.parent if Path(checkpoint).parent.name == "checkpoints" else None
    if not needs_baseline(names, curves=False):  # no method here reads one
        settings = replace(settings, baseline="zeros")
    try:
        baseline, _ = shared_baseline(model, config, settings, device, run, Path(checkpoint))
    except InputError as error:
        print(f"baseline: zeros ({error})", flush=True)
        baseline, _ = shared_baseline(model, config, replace(settings, baseline="zeros"), device, run)
    assert baseline is not None  # dataset_mean or zeros: one feature for every image
    explained = explain_captions(
        model.decoder, grids, tokens, names, baseline.to(grids), settings, curves=False
    )
    written = []
    matcher = WordMatcher()
    for item, explanation, stem in zip(captioned, explained, stems, strict=True):
        maps = {name: explanation.maps[name] for name in names}
        named = word_boxes(item.words, item.record.image_id, drawing.boxes, matcher)
        image = load_image(item.record.path)
        figure = method_figure(image, item.words, maps, model.grid, drawing.mode, drawing.cmap, boxes=named)
        path = save_figure(figure, Path(drawing.out_dir) / f"{stem}.{drawing.file_format}")
        written.append((path, len(item.words) + 1))
    return written
