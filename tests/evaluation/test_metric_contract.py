"""The contract of every metric in ``METRICS`` (parametrized over its names, so a newly registered
metric is held to it): the properties each metric's docstring states, through its ``compute``.

- a caption identical to all its references scores at least as well as any other caption;
- every score lies in the metric's ``[lowest, highest]``;
- the result does not depend on the order of the images;
- a caption sharing no word with its references scores ``lowest``;
- per-image scores come back for every image (none from a corpus statistic, ``per_image`` false).

Metrics that need Java are marked ``java`` and skipped only where ``java`` is missing (or, as
SPICE, where what they need beside it is not installed: ``Metric.unavailable``).
"""

from __future__ import annotations

import functools
import shutil

import pytest
from tool_runs import script_module

from captioning.evaluation.java import DEFAULT_TIMEOUT_S
from captioning.evaluation.scorers import METRICS, Metric, reported_metrics, validation_metrics

# Tokenized as the metrics take them (lower case, space-separated); the images share some words,
# so that CIDEr-D's document frequencies differ between n-grams.
REFERENCE = {
    1: "a small red circle above a large blue square",
    2: "two green triangles to the left of a yellow star",
    3: "a large purple square below a small red triangle",
    4: "one orange circle next to a blue star",
}
IMAGE_IDS = list(REFERENCE)
# Other captions for every image: a word changed, words missing, words added, shuffled, another
# image's caption, and nothing.
OTHER_CAPTIONS = {
    "one word changed": {i: caption.replace("a ", "the ", 1) for i, caption in REFERENCE.items()},
    "words missing": {i: " ".join(caption.split()[:4]) for i, caption in REFERENCE.items()},
    "words added": {i: caption + " on a white background" for i, caption in REFERENCE.items()},
    "shuffled": {i: " ".join(reversed(caption.split())) for i, caption in REFERENCE.items()},
    "another image's": {i: REFERENCE[IMAGE_IDS[(k + 1) % 4]] for k, i in enumerate(IMAGE_IDS)},
    "empty": dict.fromkeys(IMAGE_IDS, ""),
}
NO_SHARED_WORD = dict.fromkeys(IMAGE_IDS, "zebra xylophone quietly yawned")


VARIANTS = {"identical": REFERENCE, **OTHER_CAPTIONS, "no shared word": NO_SHARED_WORD}
# One scoring call holds every variant's captions of every image (variant k, image i: id 100 * k + i),
# each against image i's references: the Java metrics start once, and captions of the same
# references are compared within one corpus.
BATCH = {100 * k + i: (label, i) for k, label in enumerate(VARIANTS) for i in IMAGE_IDS}


def metric_params() -> list:
    return [
        # Each Java metric starts a JVM per call (METEOR: tens of seconds a test): the slow tier.
        pytest.param(name, marks=[pytest.mark.java, pytest.mark.slow] if METRICS[name].needs_java else [])
        for name in METRICS.names()
    ]


def usable(name: str) -> Metric:
    """The metric ``name``; the test is skipped where Java, or what the metric needs beside it, is missing."""
    metric = METRICS[name]()
    if metric.needs_java and shutil.which("java") is None:
        pytest.skip(f"{name} needs a Java runtime")
    reason = metric.unavailable()
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    return metric


@functools.cache
def compute(name: str, image_ids: tuple[int, ...]) -> dict[str, tuple[float, dict[int, float]]]:
    """``{key: (corpus score, {image id: score})}`` of metric ``name`` over the ``BATCH`` ids given,
    every reference three times, checking that per-image scores come back for every image."""
    metric = usable(name)
    gts = {j: [REFERENCE[BATCH[j][1]]] * 3 for j in image_ids}
    res = {j: [VARIANTS[BATCH[j][0]][BATCH[j][1]]] for j in image_ids}
    computed = metric.compute(gts, res, list(image_ids), DEFAULT_TIMEOUT_S)
    assert set(computed) == set(metric.reports)
    scores = {}
    for key, (corpus, per_image) in computed.items():
        assert len(per_image) == (len(image_ids) if metric.per_image else 0), key
        # A metric without per-image scores (NLTK's corpus BLEU-4) gives none.
        per_image_scores = (
            dict(zip(image_ids, map(float, per_image), strict=True)) if metric.per_image else {}
        )
        scores[key] = (float(corpus), per_image_scores)
    return scores


def ids_of(*labels: str) -> tuple[int, ...]:
    return tuple(j for j, (label, _) in BATCH.items() if label in labels)


@pytest.mark.parametrize("name", metric_params())
def test_the_metric_states_what_it_reports_and_needs(name):
    metric = METRICS[name]
    assert issubclass(metric, Metric) and metric.__doc__ and metric.reports
    assert metric.lowest < metric.highest
    assert metric.java_part or not metric.needs_java
    assert set(metric.reports) <= set(reported_metrics())
    in_validation = set(metric.reports) & set(validation_metrics())
    assert bool(in_validation) == (metric.validates and not metric.needs_java and not metric.on_request)
    help_text = script_module("evaluate.py").get_args_parser().format_help()  # evaluate.py --help lists it
    assert all(key in help_text for key in metric.reports)


@pytest.mark.parametrize("name", metric_params())
def test_an_identical_caption_scores_best_and_every_score_is_in_range(name):
    metric = usable(name)
    low, high = metric.lowest - 1e-9, metric.highest + 1e-9
    for key, (corpus, per_image) in compute(name, tuple(BATCH)).items():
        assert low <= corpus <= high, key
        for j, score in per_image.items():
            best = per_image[100 * 0 + BATCH[j][1]]  # the identical caption of the same image
            assert low <= score <= best + 1e-9 and best <= high, (key, BATCH[j])
    # Corpus scores, one corpus per variant: for a corpus statistic (no per-image scores to compare), and
    # for every metric that needs no Java (a Java metric starts anew for each corpus: seconds each).
    if metric.per_image and metric.needs_java:
        return
    identical = compute(name, ids_of("identical"))
    for label in OTHER_CAPTIONS:
        for key, (corpus, _) in compute(name, ids_of(label)).items():
            assert low <= corpus <= identical[key][0] + 1e-9, (key, label)


@pytest.mark.parametrize("name", metric_params())
def test_the_order_of_the_images_does_not_matter(name):
    forward = compute(name, tuple(BATCH))
    backward = compute(name, tuple(reversed(BATCH)))
    for key, (corpus, per_image) in forward.items():
        assert backward[key][0] == pytest.approx(corpus, abs=1e-12), key
        assert backward[key][1] == pytest.approx(per_image, abs=1e-12), key


@pytest.mark.parametrize("name", metric_params())
def test_a_caption_sharing_no_word_scores_the_lowest(name):
    metric = usable(name)
    alone = compute(name, ids_of("no shared word"))
    batch = compute(name, tuple(BATCH))
    for key, (corpus, per_image) in alone.items():
        assert corpus == pytest.approx(metric.lowest, abs=1e-9), key
        scores = [
            *per_image.values(),
            *(batch[key][1][j] for j in ids_of("no shared word") if metric.per_image),
        ]
        assert all(score == pytest.approx(metric.lowest, abs=1e-9) for score in scores), key


@pytest.mark.parametrize("name", metric_params())
def test_per_image_scores_come_back_for_every_image(name):
    expected = list(BATCH) if METRICS[name].per_image else []
    for key, (_, per_image) in compute(name, tuple(BATCH)).items():
        assert list(per_image) == expected, key
