#!/usr/bin/env python
"""Train a Show, Attend and Tell captioner.

With no arguments: the built-in Shapes demo (configs/shapes.yaml) on the offline pretrained
EfficientNet-Lite0: generate data, cache features, train, score the test split, draw attention.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioning.cli.common import (
    add_config_arguments,
    add_import_argument,
    config_from_args,
    given_keys,
    run_cli,
)


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python train.py                                     # Shapes demo\n"
        "  python train.py --config configs/coco_resnet101.yaml --lr 2e-4\n"
        "  python train.py --config configs/coco_resnet101.yaml --resume\n"
        "  torchrun --nproc-per-node 4 train.py --config configs/coco_resnet101.yaml --amp bf16\n"
        "  torchrun --nproc-per-node 4 --max-restarts 3 train.py --config configs/coco_resnet101.yaml "
        "--resume auto",
    )
    add_config_arguments(parser)
    add_import_argument(parser)
    parser.add_argument(
        "--resume",
        nargs="?",
        const="last",
        default=None,
        metavar="CHECKPOINT",
        help="continue a run exactly: from CHECKPOINT, or from <output-dir>/checkpoints/last.pt; "
        "the run keeps the checkpoint's epochs unless --epochs or --scst-epochs is given; "
        "'--resume auto' continues from last.pt when there is one and starts a new run "
        "when there is none (for restarts and requeued jobs; also train.resume: auto)",
    )
    parser.add_argument(
        "--cache-only",
        action="store_true",
        help="only prepare the data and cache the frozen encoder's features of every split, then stop",
    )
    parser.add_argument(
        "--no-test",
        action="store_true",
        help="skip scoring the test split, the figures and the report after training",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(args: argparse.Namespace) -> None:
    config = config_from_args(args)
    from captioning.cli.train import cache_only, main_job  # after the configuration is known to be valid

    if args.cache_only:
        cache_only(config, progress=not args.no_progress)
        return
    resume = args.resume
    if resume == "last":
        resume = Path(config.train.output_dir) / "checkpoints" / "last.pt"
    main_job(
        config,
        resume=resume,
        progress=not args.no_progress,
        test=not args.no_test,
        length_given=given_keys(args),
    )


if __name__ == "__main__":
    sys.exit(run_cli(main, get_args_parser()))
