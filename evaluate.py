#!/usr/bin/env python
"""Generate captions with a trained checkpoint and score them with the COCO caption metrics.

Uses:
  python evaluate.py --checkpoint ckpt.pt --split test        decode a split, write results, score them
  python evaluate.py --annotations captions_val2014.json --results results.json   score any results file
  python evaluate.py --checkpoint ckpt.pt --images some/folder  caption plain images (no scores)
  python evaluate.py --compare A.json B.json --annotations captions.json   paired bootstrap of two systems
  python evaluate.py --compare a1.json a2.json a3.json --against b1.json b2.json b3.json --names LSTM TF \\
      --annotations captions.json                                seeds against seeds
  python evaluate.py --aggregate runs/*/test_scores.json      mean, std, min, max over seeds

Results are COCO format ([{"image_id": ..., "caption": ...}]); scores (the metrics listed at the
end, grounding, CHAIR, CLIP-S with --clip-score, a signature) go to --out, by default
<name>_scores.json beside <name>_results.json, with per-image scores in
<name>_scores.per_image.json. Without --results, <name> is eval_<checkpoint stem>_<split> (or
_images), in the checkpoint's run folder when it sits in one (<run>/checkpoints/x.pt), else in
the current folder: never the main job's test_*.json.
METEOR (and the official PTB tokenizer) need Java; without it, or past --java-timeout, they are
reported as unavailable and a Python tokenizer is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioning.cli.common import add_import_argument


def get_args_parser() -> argparse.ArgumentParser:
    from captioning.cli.decoding_flags import add_decoding_flags
    from captioning.config import CHAIR_TABLES
    from captioning.evaluation.scorers import describe_metrics
    from captioning.explain import config as explain_config

    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"metrics (registered; a module of your own adds one with --import): {describe_metrics()}",
    )
    source = parser.add_argument_group("what to evaluate")
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="a checkpoint written by train.py, a run folder (the checkpoint its test scores came from), "
        "or a model folder written by save_pretrained",
    )
    source.add_argument(
        "--split", default=None, help="split of the checkpoint's dataset to decode (train/val/test)"
    )
    source.add_argument("--images", type=Path, help="a folder of images to caption (no scores)")
    source.add_argument(
        "--annotations", type=Path, help="COCO-format reference captions (captions_val2014.json)"
    )
    source.add_argument(
        "--results",
        type=Path,
        help="results file to score (with --annotations) or to write (default: "
        "eval_<checkpoint stem>_<split>_results.json in the checkpoint's run folder)",
    )
    source.add_argument(
        "--config", type=Path, help="take the dataset from this YAML instead of the checkpoint"
    )
    tools = parser.add_argument_group("comparing systems and runs")
    tools.add_argument(
        "--compare",
        type=Path,
        nargs="+",
        metavar="RESULTS.json",
        help="two COCO results files of the same images (A B): per-metric B - A with a 95%% paired "
        "bootstrap interval, p-value and Holm-adjusted p-value (needs --annotations); grounding "
        "and CHAIR too where both have per-image scores beside them; with --against, the "
        "results of A's runs (one per seed)",
    )
    tools.add_argument(
        "--against",
        type=Path,
        nargs="+",
        metavar="RESULTS.json",
        help="the results of B's runs (one per seed): the mean difference over seeds, its interval "
        "resampling runs as well as images",
    )
    tools.add_argument(
        "--names",
        nargs=2,
        metavar=("A", "B"),
        help="column names of the two systems (default: the files' names, or their folders')",
    )
    tools.add_argument(
        "--resamples",
        type=int,
        default=1000,
        help="bootstrap resamples for --compare and --faithfulness's intervals and tests",
    )
    tools.add_argument(
        "--seed", type=int, default=0, help="seed of the --compare and --faithfulness resampling"
    )
    tools.add_argument(
        "--aggregate",
        type=Path,
        nargs="+",
        metavar="SCORES.json",
        help="test_scores.json of runs that differ only in train.seed: mean, std, min, max",
    )
    decoding = parser.add_argument_group(
        "decoding (one flag per decode.* key; defaults: the checkpoint's configuration)"
    )
    add_decoding_flags(
        decoding,
        notes={
            "num_return": "(with --split the first is scored; all go to <prefix>_ranked.json with the "
            "oracle and diversity measures)"
        },
    )
    decoding.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a data.* or decode.* key of the checkpoint's configuration, e.g. "
        "--set data.chair_table=extended (repeatable; the flags above win)",
    )
    scoring = parser.add_argument_group("scoring")
    scoring.add_argument(
        "--out",
        type=Path,
        help="scores JSON (default: <name>_scores.json for <name>_results.json); with --compare "
        "or --aggregate, their JSON (default: printed only)",
    )
    scoring.add_argument(
        "--instances",
        type=Path,
        nargs="+",
        help="COCO instances JSON files with boxes: attention grounding and object hallucination "
        "(CHAIR-i, CHAIR-s) on the images they cover (default: the checkpoint's "
        "data.instances; Shapes: automatic)",
    )
    scoring.add_argument(
        "--chair-table",
        choices=CHAIR_TABLES,
        help="CHAIR's word table: released (Rohrbach et al.'s table and rules, as published CHAIR "
        "numbers count) or extended (this project's); default: the checkpoint's "
        "data.chair_table, else released",
    )
    scoring.add_argument(
        "--pointing-tolerance",
        type=float,
        metavar="PIXELS",
        help="the published pointing game (Zhang et al. 2016) counts a hit when a named object's "
        "pixel lies within this many pixels of the attention map's maximum (default: the "
        "checkpoint's data.pointing_tolerance, else 15, as published); the strict pointing game "
        "is printed beside it",
    )
    scoring.add_argument(
        "--no-java", action="store_true", help="use the pure-Python path even if Java is present"
    )
    scoring.add_argument(
        "--java-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="time limit of each Java call (PTB tokenizer, METEOR); past it, the Java-less "
        "path is used (default: 600)",
    )
    scoring.add_argument(
        "--spice", action="store_true", help="also compute SPICE (needs Stanford CoreNLP models)"
    )
    scoring.add_argument(
        "--clip-score",
        nargs="?",
        const="pretrained",
        metavar="WEIGHTS",
        help="also CLIP-S and RefCLIP-S (Hessel et al. 2021; CLIP ViT-B/32, the clip extra) with "
        "--checkpoint and --split; WEIGHTS: pretrained (the default: from the Hugging Face "
        "cache, downloaded when online) or a weights file",
    )
    scoring.add_argument(
        "--tokenizer",
        default="ptb",
        help="tokenizer of a scored results file (--annotations, --compare): ptb (English), "
        "whitespace, jieba (Chinese words, as AI Challenger and COCO-CN), mecab (Japanese words, "
        "as STAIR Captions), characters, or one an --import module registers; METEOR and SPICE "
        "only with ptb. A checkpoint's "
        "captions are scored with its own data.tokenizer",
    )
    explaining = parser.add_argument_group("faithfulness of the maps (with --checkpoint and --split)")
    explaining.add_argument(
        "--faithfulness",
        nargs="?",
        const="default",
        metavar="METHODS",
        help="also explain every word with attribution methods (comma-separated: attention, gradient, "
        "integrated_gradients, gradcam, occlusion; rollout, chefer for the Transformer; default: all "
        "that fit the model) and measure them: deletion and insertion areas against a random order, "
        "cascading randomisation, grounding and hallucinated mentions per method; written into the "
        "scores as 'faithfulness' (docs/attention-and-report.md)",
    )
    explaining.add_argument(
        "--faithfulness-images", type=int, default=0, metavar="N", help="explain the first N images (0: all)"
    )
    explaining.add_argument(
        "--faithfulness-figures",
        type=int,
        default=20,
        metavar="N",
        help="draw the maps of the first N explained images, one row per method, on the page "
        "<name>_faithfulness.html written beside the scores with the table (20; 0: the table only)",
    )
    explain_config.add_explain_flags(
        explaining, explain_config.ExplainConfig
    )  # one per flagged field of ExplainConfig, its checks and defaults
    explaining.add_argument(
        "--data-randomised-checkpoint",
        type=Path,
        metavar="PATH",
        help="Adebayo et al.'s data randomisation test: a checkpoint of the same model and data trained "
        "with --set data.shuffle_captions=true; each method's maps of the sanity images are compared "
        "with its maps there (docs/attention-and-report.md)",
    )
    parser.add_argument(
        "--skip-bad-images",
        action="store_true",
        help="leave out (and count) images that cannot be read instead of stopping",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    add_import_argument(parser)
    return parser


def main(args: argparse.Namespace) -> None:
    from captioning.cli.evaluate import evaluate

    evaluate(args)


if __name__ == "__main__":
    from captioning.cli.common import run_cli

    sys.exit(run_cli(main, get_args_parser()))
