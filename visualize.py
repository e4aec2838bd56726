#!/usr/bin/env python
"""Draw where a trained captioner looks: one figure per image, one panel per generated word.

Captions each image (beam search with the checkpoint's decoding options) and writes a figure:
the image titled by its caption, then each word's attention map over it, every word on one
colour scale with a colour bar and its peak weight and entropy under its panel. With --split, the
first --num images of that split of the checkpoint's dataset are used, their reference captions
are printed under the figures and the ground-truth boxes of the objects a word names are drawn on
its panel. --html also writes one self-contained interactive page.
--serve starts a local web demo instead (needs the demo extra: pip install -e ".[demo]").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioning.cli.common import add_import_argument, run_cli
from captioning.utils.errors import InputError


def get_args_parser() -> argparse.ArgumentParser:
    from captioning.cli.decoding_flags import add_decoding_flags

    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python visualize.py photo.jpg --checkpoint runs/shapes/checkpoints/best.pt\n"
        "  python visualize.py a.jpg b.png --checkpoint best.pt --mode gaussian --format pdf --html a.html\n"
        "  python visualize.py --split val --num 20 --checkpoint best.pt --html val.html\n"
        "  python visualize.py photo.jpg --checkpoint best.pt --layer 1 --head 3   # a Transformer's head\n"
        "  python visualize.py photo.jpg --checkpoint best.pt --normalize word --cmap jet   # the old look\n"
        "  python visualize.py --serve runs/shapes --port 7860   # a demo in the browser",
    )
    parser.add_argument("images", nargs="*", type=Path, metavar="IMAGE", help="image files to caption")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="a checkpoint written by train.py, a run folder (the checkpoint its test scores came from), "
        "or a model folder written by save_pretrained",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path("visualizations"),
        help="figure folder (default: ./visualizations)",
    )
    parser.add_argument(
        "--mode",
        choices=("bilinear", "gaussian"),
        default="bilinear",
        help="attention upsampling: smooth bilinear, or blocks blurred as in the paper",
    )
    parser.add_argument(
        "--normalize",
        choices=("figure", "absolute", "word"),
        default="figure",
        help="colour scale: one for all words of a figure, 0 to its largest weight, at least 4x an even "
        "spread so that a flat map looks flat (default); "
        "absolute, 0 to 1; or word, each map to its own peak (a flat map looks as hot as a "
        "sharp one)",
    )
    parser.add_argument(
        "--cmap",
        default="viridis",
        help="matplotlib colour map of the overlays (default: viridis; jet for the old look)",
    )
    parser.add_argument(
        "--format",
        dest="file_format",
        choices=("png", "pdf", "svg"),
        default="png",
        help="figure file format",
    )
    parser.add_argument("--html", type=Path, default=None, help="also write an interactive HTML report here")
    parser.add_argument(
        "--layer",
        default=None,
        metavar="N|mean",
        help="attention of decoder layer N (1-based) or the mean of the layers (default: the last)",
    )
    parser.add_argument(
        "--head",
        default=None,
        metavar="H|mean",
        help="attention head H (1-based) or the mean of the heads (default: mean)",
    )
    parser.add_argument(
        "--method",
        default=None,
        metavar="METHODS",
        help="draw attribution methods beside attention, one row per method on its own colour scale "
        "in its units (needs the explain extra): "
        "comma-separated names (attention, gradient, integrated_gradients, gradcam, occlusion; rollout, "
        "chefer for the Transformer; an --import module may add one), e.g. --method attention,gradcam",
    )
    data = parser.add_argument_group("images of a dataset split instead of IMAGE files")
    data.add_argument("--split", default=None, help="train, val or test of the checkpoint's dataset")
    data.add_argument("--num", type=int, default=20, help="the first NUM images of the split (default: 20)")
    data.add_argument("--config", type=Path, default=None, help="take the dataset from this YAML instead")
    data.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a data.* or decode.* key, e.g. --set decode.max_length=12 (repeatable)",
    )
    decoding = parser.add_argument_group(
        "decoding (one flag per decode.* key; defaults: the checkpoint's configuration, beam search)"
    )
    add_decoding_flags(
        decoding,
        notes={"num_return": "(the figure shows the first one's attention and lists the others under it)"},
    )
    demo = parser.add_argument_group("a live demo in the browser instead of figure files")
    demo.add_argument(
        "--serve",
        type=Path,
        default=None,
        metavar="CHECKPOINT_OR_FOLDER",
        help="serve a local web app (Gradio) captioning uploaded images with this model: a checkpoint, "
        "a run folder (the checkpoint its test scores came from) or a model folder",
    )
    demo.add_argument("--port", type=int, default=7860, help="the demo's port (default: 7860)")
    demo.add_argument(
        "--host", default="127.0.0.1", help="the demo's address (default: 127.0.0.1, this machine only)"
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    add_import_argument(parser)
    return parser


def main(args: argparse.Namespace) -> None:
    if args.serve is not None:
        if args.checkpoint is not None or args.images or args.split is not None:
            raise InputError("--serve takes the model itself: give no --checkpoint, IMAGE or --split")
        from captioning.cli.serve import serve

        serve(args.serve, port=args.port, host=args.host, device=args.device)
        return
    if args.checkpoint is None:
        raise InputError("give --checkpoint (with IMAGE files or --split), or --serve CHECKPOINT_OR_FOLDER")
    from captioning.cli.decoding_flags import decoding_changes
    from captioning.cli.visualize import visualize_images

    result = visualize_images(
        args.checkpoint,
        args.images,
        split=args.split,
        num=args.num,
        data_config=args.config,
        overrides=args.overrides,
        out_dir=args.out_dir,
        mode=args.mode,
        file_format=args.file_format,
        html=args.html,
        decoding=decoding_changes(args),
        device=args.device,
        layer=args.layer,
        head=args.head,
        progress=not args.no_progress,
        normalize=args.normalize,
        cmap=args.cmap,
        methods=args.method,
    )
    print(result.summary())
    warning = result.warning()  # fewer captions than --num-return asked for
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(run_cli(main, get_args_parser()))
