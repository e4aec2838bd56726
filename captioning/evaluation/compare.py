"""``evaluate.py --compare A.json B.json --annotations REFS``: two systems' results, paired bootstrap."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from captioning.data.tokenizers import tokenize
from captioning.evaluation.chair_table import chair_table
from captioning.evaluation.coco_files import EvaluationInputError, load_coco_references, load_results
from captioning.evaluation.grounding import Instances
from captioning.evaluation.java import DEFAULT_TIMEOUT_S
from captioning.evaluation.metrics import score_captions, tokenize_captions
from captioning.evaluation.ratios import (
    CLASS_MEAN,
    RATIO_METRICS,
    aligned_classes,
    chair_statistics,
    read_ratio_statistics,
)
from captioning.evaluation.scorers import METRICS
from captioning.evaluation.signature import make_signature, signature_differences
from captioning.evaluation.significance import (
    bleu_statistics,
    class_mean_score,
    comparison_table,
    corpus_bleu,
    group_bootstrap,
    ratio_score,
)
from captioning.utils.files import atomic_write, output_note
from captioning.utils.memory import available_bytes, gib

# Ratio metrics whose score is not one sum over one count.
RATIO_SCORES = {CLASS_MEAN: class_mean_score}


def per_image_metrics() -> tuple[str, ...]:
    """The score keys compared as the mean of their per-image scores (for most, their corpus score):
    those of every registered metric with per-image scores but BLEU, which is resampled from its
    n-gram statistics instead (``bleu_statistics``)."""
    return tuple(
        key
        for name, metric in METRICS.items()
        if metric.per_image and name != "BLEU"
        for key in metric.reports
    )


def read_pair(annotations: Path, results_a: Path, results_b: Path) -> tuple[dict, dict, dict]:
    """The two results files and their images' references, refusing different image sets.

    Returns:
        (references, captions of A, captions of B), each keyed by image id.
    Raises:
        EvaluationInputError: one line naming a file and an image id that breaks the pairing.
    """
    references = load_coco_references(annotations)
    a, b = load_results(results_a), load_results(results_b)
    for first, second, first_path, second_path in (
        (a, b, results_a, results_b),
        (b, a, results_b, results_a),
    ):
        extra = sorted(set(first) - set(second))
        if extra:
            raise EvaluationInputError(
                f"{first_path}: image_id {extra[0]}: not in {second_path} (a paired "
                "comparison needs both systems' captions of the same images)"
            )
    missing = sorted(set(a) - set(references))
    if missing:
        raise EvaluationInputError(
            f"{results_a}: image_id {missing[0]}: no reference captions in {annotations}"
        )
    if not a:
        raise EvaluationInputError(f"{results_a}: no results to compare")
    image_ids = sorted(a)
    return {i: references[i] for i in image_ids}, a, b


def read_groups(annotations: Path, runs_a: Sequence[Path], runs_b: Sequence[Path]) -> tuple[dict, list, list]:
    """Every run's results file and their images' references, refusing different image sets.

    Returns:
        (references, captions of each run of A, captions of each run of B), keyed by image id.
    Raises:
        EvaluationInputError: one line naming a file and an image id that breaks the pairing.
    """
    references, first, _ = read_pair(annotations, runs_a[0], runs_b[0])
    captions: list[list[dict]] = [[], []]
    for group, runs in enumerate((runs_a, runs_b)):
        for path in runs:
            run = first if path == runs_a[0] else load_results(path)
            extra, missing = sorted(set(run) - set(first)), sorted(set(first) - set(run))
            if extra:
                raise EvaluationInputError(
                    f"{path}: image_id {extra[0]}: not in {runs_a[0]} (runs compare only on the same images)"
                )
            if missing:
                raise EvaluationInputError(
                    f"{runs_a[0]}: image_id {missing[0]}: not in {path} (runs compare "
                    "only on the same images)"
                )
            captions[group].append(run)
    return references, captions[0], captions[1]


def default_names(runs_a: Sequence[Path], runs_b: Sequence[Path]) -> tuple[str, str]:
    """Column names: the two files' stems, or their folders' names where the stems agree
    (``lstm/test_results.json``, ``tf/test_results.json`` -> ``lstm``, ``tf``); ``A``, ``B`` otherwise."""
    if len(runs_a) == len(runs_b) == 1:
        a, b = Path(runs_a[0]).resolve(), Path(runs_b[0]).resolve()
        for name_a, name_b in ((a.stem, b.stem), (a.parent.name, b.parent.name)):
            if name_a and name_b and name_a != name_b:
                return name_a, name_b
    return "A", "B"


def compare_results_files(
    annotations: Path,
    results_a: Path | Sequence[Path],
    results_b: Path | Sequence[Path],
    use_java: bool | None = None,
    spice: bool = False,
    resamples: int = 1000,
    seed: int = 0,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    names: Sequence[str] | None = None,
    instances: Instances | None = None,
    tokenizer: str = "ptb",
    chair: str = "released",
) -> dict[str, Any]:
    """Score two systems' results files on the same images and compare them metric by metric.

    Each side is one results file, or several (one per training seed): the comparison is then
    of the mean over each side's runs, with an interval that includes the variance between seeds
    (``significance.group_bootstrap``). Grounding and CHAIR are compared when every run's
    per-image scores hold them (``ratios``); with ``instances``, CHAIR is computed from the captions.
    ``tokenizer``: the tokens the metrics are computed on, as for :func:`score_captions`; ``chair``: CHAIR's
    word table when it is computed from the captions (the signatures then name it and the instances).

    Returns:
        ``{"metrics": {metric: {"a", "b", "difference", "ci_low", "ci_high", "p_value", "p_holm"}},
        "names": {"a", "b"}, "images", "resamples", "seed", "signatures": {"a", "b"}, "results": {"a", "b"},
        "runs": {"a", "b"}, "per_run": {"a", "b"}, "table"}``; ``difference`` is B - A. With one
        run a side, ``signatures`` and ``results`` hold one string each, else lists.
    """
    check_bootstrap_options(resamples, seed)
    _check_names(names)
    runs_a = [Path(results_a)] if isinstance(results_a, str | Path) else [Path(p) for p in results_a]
    runs_b = [Path(results_b)] if isinstance(results_b, str | Path) else [Path(p) for p in results_b]
    columns = (names[0], names[1]) if names else default_names(runs_a, runs_b)
    references, captions_a, captions_b = read_groups(annotations, runs_a, runs_b)
    image_ids = list(references)
    check_bootstrap_fits(resamples, len(references))  # before scoring: the draws are held in memory at once
    if use_java is None:
        use_java = shutil.which("java") is not None
    score_run = partial(
        _score_run,
        references,
        use_java=use_java,
        spice=spice,
        java_timeout=java_timeout,
        tokenizer=tokenizer,
        instances=instances,
        chair=chair,
    )
    sides = []
    for runs, captions in ((runs_a, captions_a), (runs_b, captions_b)):
        side: dict[str, list[Any]] = {
            "per_image": [],
            "bleu": [],
            "ratios": [],
            "classes": [],
            "signatures": [],
        }
        for path, run in zip(runs, captions, strict=True):
            for key, value in score_run(path, run).items():
                side[key].append(value)
        sides.append(side)
    a, b = sides
    comparisons = _compare_sides(a, b, resamples, seed)

    def one_or_all(values: list) -> Any:
        return values[0] if len(values) == 1 else values

    return {
        "metrics": {metric: c.to_json() for metric, c in comparisons.items()},
        "names": {"a": columns[0], "b": columns[1]},
        "images": len(image_ids),
        "resamples": resamples,
        "seed": seed,
        "signatures": {"a": one_or_all(a["signatures"]), "b": one_or_all(b["signatures"])},
        "results": {"a": one_or_all([str(p) for p in runs_a]), "b": one_or_all([str(p) for p in runs_b])},
        "runs": {"a": len(runs_a), "b": len(runs_b)},
        "per_run": {"a": run_scores(a, comparisons), "b": run_scores(b, comparisons)},
        "table": comparison_table(comparisons, columns),
    }


def _check_names(names: Sequence[str] | None) -> None:
    """Each column name is a heading: one printable line, or the table breaks."""
    for name in names or ():
        if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > 60:
            raise EvaluationInputError(
                f"--names {name!r:.80}: a column name is one line of at most 60 printable characters"
            )


def _compare_sides(
    a: dict[str, list[Any]], b: dict[str, list[Any]], resamples: int, seed: int
) -> dict[str, Any]:
    """The paired (group) bootstrap of every metric both sides' runs hold, ratios included."""
    sides = (a, b)
    # The class mean over one class list for every run of both sides.
    every_run = [ratios for side in sides for ratios in side["ratios"]]
    for ratios, statistics in zip(
        every_run, aligned_classes([c for side in sides for c in side["classes"]]), strict=False
    ):
        ratios[CLASS_MEAN] = statistics
    shared = [
        metric
        for metric in (*RATIO_METRICS, CLASS_MEAN)
        if all(metric in ratios for side in sides for ratios in side["ratios"])
    ]
    return group_bootstrap(
        a["per_image"],
        b["per_image"],
        a["bleu"],
        b["bleu"],
        resamples,
        seed,
        [{m: r[m] for m in shared} for r in a["ratios"]],
        [{m: r[m] for m in shared} for r in b["ratios"]],
        RATIO_SCORES,
    )


def _score_run(
    references: Mapping[int, list[str]],
    path: Path,
    run: Mapping[int, str],
    *,
    use_java: bool,
    spice: bool,
    java_timeout: float,
    tokenizer: str,
    instances: Instances | None,
    chair: str,
) -> dict[str, Any]:
    """One run's share of a side (:func:`compare_results_files`): its per-image scores, BLEU
    statistics, ratio statistics (grounding from its scores file; CHAIR from its captions with
    ``instances``), class statistics and signature."""
    image_ids = list(references)
    scores = score_captions(
        references, run, use_java=use_java, spice=spice, java_timeout=java_timeout, tokenizer=tokenizer
    )
    per_image = {
        metric: np.array([scores.per_image[i][metric] for i in image_ids])
        for metric in per_image_metrics()
        if scores.overall.get(metric) is not None
    }
    # BLEU's statistics from each run's own tokens: Java's tokenizer may have timed out for one only.
    gts, res = tokenize_captions(references, run, scores.tokenizer == "ptb", java_timeout, tokenizer)
    ratios, classes = read_ratio_statistics(path, image_ids)
    if instances is not None:
        ratios.update(
            chair_statistics(
                {i: tokenize(c) for i, c in run.items()},
                {i: [tokenize(r) for r in references[i]] for i in image_ids},
                instances,
                image_ids,
                chair,
            )
        )
    signature = make_signature(
        references,
        scores.tokenizer,
        results=path,
        chair=chair if instances is not None else None,
        boxes=instances,
        table=chair_table(chair) if instances is not None else None,
    )
    return {
        "per_image": per_image,
        "bleu": bleu_statistics(gts, res, image_ids),
        "ratios": ratios,
        "classes": classes,
        "signatures": signature,
    }


def run_scores(side: dict, comparisons: Mapping[str, Any]) -> dict[str, list[float]]:
    """Each compared metric's score in each run of one side (BLEU at corpus level, ratios as sum / count)."""
    scores: dict[str, list[float]] = {}
    for metric in comparisons:
        if metric.startswith("BLEU-"):
            sums = np.stack([stats.sum(axis=0) for stats in side["bleu"]])
            scores[metric] = corpus_bleu(sums, int(metric[5:])).tolist()
        elif metric in RATIO_METRICS or metric == CLASS_MEAN:
            score = RATIO_SCORES.get(metric, ratio_score)
            scores[metric] = score(np.stack([r[metric].sum(axis=0) for r in side["ratios"]])).tolist()
        else:
            scores[metric] = [float(np.mean(run[metric])) for run in side["per_image"]]
    return scores


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
        raise EvaluationInputError(
            f"--resamples: {resamples} resamples of {images} images need about {gib(needed)}, "
            f"more than the {gib(free)} available; at most {free // (24 * images)}"
        )


def compare_command(
    annotations: Path,
    results_a: Path | Sequence[Path],
    results_b: Path | Sequence[Path],
    out: Path | None,
    use_java: bool | None,
    spice: bool,
    resamples: int,
    seed: int,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    names: Sequence[str] | None = None,
    instances: Instances | None = None,
    tokenizer: str = "ptb",
    chair: str = "released",
) -> dict[str, Any]:
    """Print the comparison table (and signatures, warning when they differ), write ``out`` if given."""
    comparison = compare_results_files(
        annotations,
        results_a,
        results_b,
        use_java,
        spice,
        resamples,
        seed,
        java_timeout,
        names,
        instances,
        tokenizer,
        chair,
    )
    print(comparison["table"])
    name_a, name_b = comparison["names"]["a"], comparison["names"]["b"]
    runs = comparison["runs"]
    print(
        f"{comparison['images']} images, {resamples} paired bootstrap resamples (seed {seed}); "
        f"B - A = {name_b} - {name_a}, x100; p: two-sided; the 95% interval is the same test's "
        "(0 outside it exactly when p < 0.05); p Holm: adjusted for the "
        f"{len(comparison['metrics'])} metrics tested at once"
    )
    if runs["a"] > 1 or runs["b"] > 1:
        print(
            f"{runs['a']} runs of {name_a}, {runs['b']} of {name_b}: the means over runs, the interval "
            "resampling runs as well as images (it includes the variance between seeds)"
        )
    elif runs["a"] == runs["b"] == 1:
        print(
            "one run a side: the interval holds the images' variance only, not the seeds' "
            "(give several runs a side with --against to include it)"
        )
    signatures = {name: comparison["signatures"][name] for name in ("a", "b")}
    listed = {name: value if isinstance(value, list) else [value] for name, value in signatures.items()}
    for name in ("a", "b"):
        for run, signature in enumerate(listed[name], start=1):
            print(f"signature {name.upper()}{run if len(listed[name]) > 1 else ''}: {signature}")
    first = listed["a"][0]
    for signature in [*listed["a"][1:], *listed["b"]]:
        warn_if_signatures_differ(first, signature)
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
        print(
            f"warning: {what} were not computed the same way ({'; '.join(differences)}): "
            "their numbers are not comparable"
        )
    return differences
