"""``evaluate.py --aggregate runs/*/test_scores.json``: one configuration trained with several seeds.

Each scores file must sit in its run folder next to the ``config.yaml`` that ``python train.py``
writes there. Runs are aggregated only when their configurations differ in nothing but
``train.seed`` and ``train.output_dir``; every metric is then summarised by its mean, sample
standard deviation (n - 1), minimum and maximum over the runs, and a 95% confidence interval of
the mean: ``mean +- t(0.975, n - 1) * std / sqrt(n)`` (Student's t over the n runs, which treats
the seeds as a sample of the seeds that could have been drawn; it says nothing of the test set's
own sampling, which ``--compare`` resamples).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from scipy.stats import t as student_t

from captioning.config import ConfigError, to_dict
from captioning.config.loading import load_config
from captioning.evaluation.attributes import ATTRIBUTE_COUNTS
from captioning.evaluation.coco_files import EvaluationInputError, read_json
from captioning.evaluation.compare import warn_if_signatures_differ
from captioning.evaluation.scorers import METRICS
from captioning.utils.files import atomic_write, not_a_regular_file, output_note, same_file

# Keys that may differ between the runs of one configuration: the seed, where the run was written,
# and how it was started (a run resumed after preemption computes what an uninterrupted one does).
SEED_KEYS = frozenset(["train.seed", "train.output_dir", "train.resume", "train.overwrite"])
# Numbers of a scores file that count things rather than measure the captions.
COUNT_KEYS = frozenset(
    [
        "images",
        "grounding-words",
        "grounding-images",
        "CHAIR-mentions",
        "CHAIR-hallucinated",
        "CHAIR-images",
        *ATTRIBUTE_COUNTS,
    ]
)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections -> ``{"section.key": value}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def run_configuration(scores_path: Path) -> dict[str, Any]:
    """The flattened configuration of the run whose scores file this is (``config.yaml`` beside it)."""
    config_path = scores_path.parent / "config.yaml"
    if not_a_regular_file(config_path):
        raise ConfigError(f"{config_path}: {not_a_regular_file(config_path)}")
    if not config_path.is_file():
        raise ConfigError(
            f"{scores_path}: no config.yaml beside it (aggregate the test_scores.json of run folders)"
        )
    return flatten(to_dict(load_config(config_path, stored=True)))


# Checked before the other keys: runs of different decoders are different systems (compare them).
DECODER_KIND = "model.decoder.kind"


def check_same_configuration(paths: Sequence[Path], configs: Sequence[Mapping[str, Any]]) -> None:
    """Refuse runs whose configurations differ in anything but the seed and the output folder.

    Raises:
        ConfigError: naming the second file and ``model.decoder.kind`` when the decoders differ,
            else the first key where it differs from the first run.
    """
    first = configs[0]
    for path, config in zip(paths[1:], configs[1:], strict=True):
        if first.get(DECODER_KIND) != config.get(DECODER_KIND):
            raise ConfigError(
                f"{path}: {DECODER_KIND}: {config.get(DECODER_KIND)!r} here but "
                f"{first.get(DECODER_KIND)!r} in {paths[0]}; runs of different decoders do not "
                "aggregate (compare them with --compare ... --against ...)"
            )
        for key in sorted(set(first) | set(config)):
            if key not in SEED_KEYS and first.get(key) != config.get(key):
                raise ConfigError(
                    f"{path}: {key}: {config.get(key)!r} here but {first.get(key)!r} in {paths[0]}; "
                    "runs aggregate only when they differ in train.seed alone"
                )


# Scores that are shares of words, mentions or images, in [0, 1] (grounding, CHAIR, attributes).
_SHARE_PREFIXES = ("grounding-", "CHAIR-", "attribute-")


def metric_range(key: str) -> tuple[float, float] | None:
    """The least and the most a score can be (a metric's ``lowest`` and ``highest``: CIDEr-D [0, 10],
    BLEU [0, 1]; shares such as CHAIR [0, 1]), or None when unknown (a metric of your own that
    does not register its key)."""
    for _, metric in METRICS.items():
        if key in metric.reports:
            return metric.lowest, metric.highest
    return (0.0, 1.0) if key.startswith(_SHARE_PREFIXES) else None


def summarise(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, sample standard deviation, min, max and 95% interval of the mean of every metric that
    every run reports.

    Args:
        runs: the scores dicts (two or more).
    Returns:
        metric -> ``{"mean", "std", "min", "max", "ci_low", "ci_high"}``, in the first run's key order;
        an interval that passes the metric's range (``metric_range``; with n = 2, t(0.975, 1) is
        12.7) is clipped to it, and ``"clipped": true`` says so.
    """

    def number(value: Any) -> TypeGuard[float]:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)

    summary: dict[str, dict[str, float]] = {}
    for key in runs[0]:
        values = [value for value in (run.get(key) for run in runs) if number(value)]
        if key in COUNT_KEYS or len(values) < len(runs):
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        half = float(student_t.ppf(0.975, len(values) - 1)) * std / math.sqrt(len(values))
        summary[key] = {
            "mean": mean,
            "std": std,
            "min": min(values),
            "max": max(values),
            "ci_low": mean - half,
            "ci_high": mean + half,
        }
        bounds = metric_range(key)
        if bounds is not None and (mean - half < bounds[0] or mean + half > bounds[1]):
            summary[key].update(
                ci_low=max(mean - half, bounds[0]), ci_high=min(mean + half, bounds[1]), clipped=True
            )
    return summary


# A metric beyond this is no score of captions (CIDEr-D, the largest, is at most 10), and sums of such
# values overflow to infinity.
MAX_METRIC = 1e6


def check_metrics(paths: Sequence[Path], runs: Sequence[Mapping[str, Any]]) -> None:
    """Every metric some run reports as a number is a finite number within ``MAX_METRIC`` in every run:
    a metric missing, null, NaN, infinite, a string or out of range in one run is named, never dropped.

    Raises:
        EvaluationInputError: ``<file>: <metric>: <what it is> (a number in <another file>)``.
    """

    def numeric(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    metrics = [
        key
        for key in dict.fromkeys(key for run in runs for key in run)
        if key not in COUNT_KEYS and any(numeric(run.get(key)) for run in runs)
    ]
    if not metrics:
        raise EvaluationInputError(f"{paths[0]}: holds no metric (nor does any other scores file given)")
    for key in metrics:
        reference = next(path for path, run in zip(paths, runs, strict=True) if numeric(run.get(key)))
        for path, run in zip(paths, runs, strict=True):
            value = run.get(key)
            if key not in run:
                what = "missing"
            elif not isinstance(value, int | float) or isinstance(value, bool):
                what = f"{value!r:.40} is not a number"
            elif not math.isfinite(value) or abs(value) > MAX_METRIC:
                what = f"{value!r} is not a finite score within +-{MAX_METRIC:g}"
            else:
                continue
            raise EvaluationInputError(
                f"{path}: {key}: {what} (a number in {reference}); every run must report the same metrics"
            )


def aggregate_runs(paths: Sequence[Path]) -> dict[str, Any]:
    """Check and summarise the scores files of several runs (see the module docstring).

    Returns:
        ``{"metrics": {metric: {"mean", "std", "min", "max", "ci_low", "ci_high"}}, "runs": [...],
        "seeds": [...], "signatures": [...]}``.
    Raises:
        ConfigError: fewer than two runs, a run without config.yaml, configurations that differ.
        EvaluationInputError: a scores file that is missing or not a JSON object.
    """
    if len(paths) < 2:
        raise ConfigError("--aggregate needs the scores files of two or more runs")
    for index, path in enumerate(paths):
        for earlier in paths[:index]:  # the same file by another name (a/../b, a link, relative and absolute)
            if Path(path) == Path(earlier) or same_file(path, earlier):
                raise ConfigError(f"{path}: given twice (also as {earlier}): each run counts once")
    scores = []
    for path in paths:
        if Path(path).is_file() and Path(path).stat().st_size == 0:
            raise EvaluationInputError(f"{path}: empty file, not a scores JSON object")
        data = read_json(path)
        if not isinstance(data, dict):
            raise EvaluationInputError(f"{path}: expected a scores JSON object, got {type(data).__name__}")
        if not isinstance(data.get("signature", ""), str):
            raise EvaluationInputError(
                f"{path}: signature must be a string, got {type(data['signature']).__name__}"
            )
        scores.append(data)
    check_metrics(paths, scores)
    configs = [run_configuration(Path(path)) for path in paths]
    check_same_configuration(list(paths), configs)
    return {
        "metrics": summarise(scores),
        "runs": [str(p) for p in paths],
        "seeds": [config["train.seed"] for config in configs],
        "signatures": [run.get("signature", "") for run in scores],
    }


def aggregate_table(aggregate: Mapping[str, Any]) -> str:
    """A console table of the aggregate (x100, as papers report)."""
    metrics = aggregate["metrics"]
    width = max([len("metric"), *map(len, metrics)])
    header = f"{'metric':<{width}}  {'mean':>7}  {'std':>6}  {'min':>7}  {'max':>7}  {'95% interval':>18}"
    lines = [header, "-" * len(header)]
    for name, s in metrics.items():
        lines.append(
            f"{name:<{width}}  {100 * s['mean']:7.2f}  {100 * s['std']:6.2f}  {100 * s['min']:7.2f}  "
            f"{100 * s['max']:7.2f}  [{100 * s['ci_low']:7.2f}, {100 * s['ci_high']:7.2f}]"
            + ("*" if s.get("clipped") else "")
        )
    runs = len(aggregate["runs"])
    lines.append(
        f"{runs} runs, seeds {', '.join(map(str, aggregate['seeds']))}; "
        "std over runs (n - 1); interval of the mean over seeds (Student's t)"
    )
    if any(s.get("clipped") for s in metrics.values()):
        lines.append(
            f"* clipped to the metric's range: with n = {runs}, t(0.975, {runs - 1}) = "
            f"{float(student_t.ppf(0.975, runs - 1)):.1f} makes the interval wider than the scores "
            "can go; more seeds narrow it"
        )
    return "\n".join(lines)


# A section another layer adds to the aggregate (the faithfulness tables over seeds): the run folders'
# scores files -> (JSON value or None when the runs hold nothing of it, console lines).
Section = Callable[[Sequence[Path]], tuple[Any, list[str]]]


def aggregate_command(
    paths: Sequence[Path], out: Path | None, sections: Mapping[str, Section] | None = None
) -> dict[str, Any]:
    """Print the aggregate, warn when the runs' signatures differ, write ``out`` if given.

    ``sections``: name -> what it adds (computed after the runs are checked and before anything is
    printed; a None value adds nothing to the JSON, its lines are printed all the same).
    """
    aggregate = aggregate_runs(paths)
    added = {name: section(paths) for name, section in (sections or {}).items()}  # checked before printing
    print(aggregate_table(aggregate))
    for name, (value, lines) in added.items():
        if lines:
            print("\n".join(lines))
        if value is not None:
            aggregate[name] = value
    first = aggregate["signatures"][0]
    for path, signature in zip(paths[1:], aggregate["signatures"][1:], strict=True):
        warn_if_signatures_differ(first, signature, f"{paths[0]} and {path}")
    if out is not None:
        note = output_note(out)  # said in the summary: replaced, or written into a device
        atomic_write(out, lambda p: p.write_text(json.dumps(aggregate, indent=2), encoding="utf-8"))
        print(f"wrote:\n  aggregate              {out}{note}")
    return aggregate
