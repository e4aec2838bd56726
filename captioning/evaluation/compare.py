"""``evaluate.py --compare A.json B.json --annotations REFS``: two systems' results, paired bootstrap."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from captioning.evaluation.java import DEFAULT_TIMEOUT_S
from captioning.evaluation.metrics import (
    EvaluationInputError,
    load_coco_references,
    load_results,
    score_captions,
    tokenize_captions,
)
from captioning.evaluation.signature import make_signature, signature_differences
from captioning.evaluation.significance import bleu_statistics, comparison_table, paired_bootstrap
from captioning.files import atomic_write, output_note
from captioning.memory import available_bytes, gib

# Metrics whose corpus score is (or is compared as) the mean of per-image scores.
PER_IMAGE_METRICS = ("METEOR", "ROUGE-L", "CIDEr-D", "SPICE")


def read_pair(annotations: Path, results_a: Path, results_b: Path) -> tuple[dict, dict, dict]:
    """The two results files and their images' references, refusing different image sets.

    Returns:
        (references, captions of A, captions of B), each keyed by image id.
    Raises:
        EvaluationInputError: one line naming a file and an image id that breaks the pairing.
    """
    references = load_coco_references(annotations)
    a, b = load_results(results_a), load_results(results_b)
    for first, second, first_path, second_path in ((a, b, results_a, results_b), (b, a, results_b, results_a)):
        extra = sorted(set(first) - set(second))
        if extra:
            raise EvaluationInputError(f"{first_path}: image_id {extra[0]}: not in {second_path} (a paired "
                                       "comparison needs both systems' captions of the same images)")
    missing = sorted(set(a) - set(references))
    if missing:
        raise EvaluationInputError(f"{results_a}: image_id {missing[0]}: no reference captions in {annotations}")
    if not a:
        raise EvaluationInputError(f"{results_a}: no results to compare")
    image_ids = sorted(a)
    return {i: references[i] for i in image_ids}, a, b


def compare_results_files(annotations: Path, results_a: Path, results_b: Path, use_java: bool | None = None,
                          spice: bool = False, resamples: int = 1000, seed: int = 0,
                          java_timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Score two results files on the same images and compare them metric by metric.

    Returns:
        ``{"metrics": {metric: {"a", "b", "difference", "ci_low", "ci_high", "p_value"}}, "images",
        "resamples", "seed", "signatures": {"a", "b"}, "results": {"a", "b"}, "table"}``;
        ``difference`` is B - A.
    """
    check_bootstrap_options(resamples, seed)
    references, a, b = read_pair(annotations, results_a, results_b)
    check_bootstrap_fits(resamples, len(references))  # before scoring: the draws are held in memory at once
    if use_java is None:
        use_java = shutil.which("java") is not None
    scores_a = score_captions(references, a, use_java=use_java, spice=spice, java_timeout=java_timeout)
    scores_b = score_captions(references, b, use_java=use_java, spice=spice, java_timeout=java_timeout)
    image_ids = list(references)
    per_image = {name: {metric: np.array([scores.per_image[i][metric] for i in image_ids])
                        for metric in PER_IMAGE_METRICS if scores.overall.get(metric) is not None}
                 for name, scores in (("a", scores_a), ("b", scores_b))}
    # BLEU's statistics from each system's own tokens: the Java tokenizer may have timed out for one only.
    gts_a, res_a = tokenize_captions(references, a, scores_a.tokenizer == "ptb", java_timeout)
    gts_b, res_b = tokenize_captions(references, b, scores_b.tokenizer == "ptb", java_timeout)
    comparisons = paired_bootstrap(per_image["a"], per_image["b"], bleu_statistics(gts_a, res_a, image_ids),
                                   bleu_statistics(gts_b, res_b, image_ids), resamples=resamples, seed=seed)
    signatures = {"a": make_signature(references, scores_a.tokenizer, results=results_a),
                  "b": make_signature(references, scores_b.tokenizer, results=results_b)}
    return {"metrics": {metric: c.to_json() for metric, c in comparisons.items()}, "images": len(image_ids),
            "resamples": resamples, "seed": seed, "signatures": signatures,
            "results": {"a": str(results_a), "b": str(results_b)},
            "table": comparison_table(comparisons, (Path(results_a).stem, Path(results_b).stem))}


def check_bootstrap_options(resamples: int, seed: int) -> None:
    """Refuse a bootstrap without resamples or with a seed numpy cannot take."""
    if resamples < 1:
        raise EvaluationInputError(f"--resamples: must be at least 1, got {resamples}")
    if seed < 0:
        raise EvaluationInputError(f"--seed: must be 0 or more, got {seed}")


def check_bootstrap_fits(resamples: int, images: int) -> None:
    """Refuse ``resamples`` whose (R, N) draws (``significance.resample_counts``) do not fit in memory."""
    needed = resamples * images * 24  # int64 draws, their flat index and float64 counts
    free = available_bytes()
    if free is not None and needed > free:
        raise EvaluationInputError(f"--resamples: {resamples} resamples of {images} images need about {gib(needed)}, "
                                   f"more than the {gib(free)} available; at most {free // (24 * images)}")


def compare_command(annotations: Path, results_a: Path, results_b: Path, out: Path | None,
                    use_java: bool | None, spice: bool, resamples: int, seed: int,
                    java_timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Print the comparison table (and signatures, warning when they differ), write ``out`` if given."""
    comparison = compare_results_files(annotations, results_a, results_b, use_java, spice, resamples, seed,
                                       java_timeout)
    print(comparison["table"])
    print(f"{comparison['images']} images, {resamples} paired bootstrap resamples (seed {seed}); "
          f"B - A, x100; p: two-sided")
    for name in ("a", "b"):
        print(f"signature {name.upper()}: {comparison['signatures'][name]}")
    warn_if_signatures_differ(comparison["signatures"]["a"], comparison["signatures"]["b"])
    if out is not None:
        overall = {k: v for k, v in comparison.items() if k != "table"}
        note = output_note(out)  # said in the summary: replaced, or written into a device
        atomic_write(out, lambda p: p.write_text(json.dumps(overall, indent=2), encoding="utf-8"))
        print(f"wrote:\n  comparison             {out}{note}")
    return comparison


def warn_if_signatures_differ(first: str, second: str, what: str = "the two sets of scores") -> list[str]:
    """Print a warning naming each field, other than the system's, where two signatures differ."""
    differences = signature_differences(first, second)
    if differences:
        print(f"warning: {what} were not computed the same way ({'; '.join(differences)}): "
              "their numbers are not comparable")
    return differences
