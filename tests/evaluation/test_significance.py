"""Paired bootstrap: coverage on synthetic systems, detection of a shift, corpus BLEU from statistics."""

from __future__ import annotations

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu

from captioning.evaluation.significance import (
    bleu_statistics,
    corpus_bleu,
    group_bootstrap,
    resample_counts,
)

GTS = {
    1: ["a dog runs on the grass", "a brown dog running in a field"],
    2: ["two people ride bikes down a street", "cyclists on a city street"],
    3: ["a plate of food with broccoli", "broccoli and rice on a plate"],
    4: ["a red circle above a blue square", "a small red circle"],
}
RES = {
    1: ["a dog running on grass"],
    2: ["people on bikes"],
    3: ["a plate with broccoli and rice on it"],
    4: ["a red circle"],
}


def test_identical_systems_interval_covers_zero_about_95_percent():
    covered = 0
    trials = 200
    for trial in range(trials):
        rng = np.random.default_rng(1000 + trial)
        a, b = rng.gamma(2.0, 0.4, size=(2, 150))  # two systems of equal expected score, per image
        c = group_bootstrap([{"CIDEr-D": a}], [{"CIDEr-D": b}], resamples=400, seed=trial)["CIDEr-D"]
        covered += c.ci_low <= 0 <= c.ci_high
        assert c.difference == pytest.approx(b.mean() - a.mean())
    assert 0.90 <= covered / trials <= 0.99


def test_shifted_system_is_found():
    rng = np.random.default_rng(7)
    a = rng.gamma(2.0, 0.4, size=300)
    b = a + 0.08 + rng.normal(0, 0.3, size=300)  # better on average, noisy per image
    c = group_bootstrap([{"CIDEr-D": a}], [{"CIDEr-D": b}], resamples=1000, seed=0)["CIDEr-D"]
    assert c.p_value < 0.05
    assert 0 < c.ci_low < c.difference < c.ci_high
    same = group_bootstrap([{"CIDEr-D": a}], [{"CIDEr-D": a}], resamples=1000, seed=0)["CIDEr-D"]
    assert same.difference == 0 and same.p_value == 1.0
    # BLEU-4 of two systems without a single 4-gram match differs by ~1e-15: no difference, not p = 0.001
    tiny = group_bootstrap([{"BLEU-4": a * 1e-14}], [{"BLEU-4": b * 1e-14}], resamples=1000, seed=0)["BLEU-4"]
    assert tiny.p_value == 1.0


def test_seeded_and_deterministic():
    rng = np.random.default_rng(3)
    a, b = rng.random((2, 50))
    first = group_bootstrap([{"m": a}], [{"m": b}], resamples=200, seed=5)
    assert first == group_bootstrap([{"m": a}], [{"m": b}], resamples=200, seed=5)
    assert first != group_bootstrap([{"m": a}], [{"m": b}], resamples=200, seed=6)
    counts = resample_counts(50, 200, seed=5)
    assert counts.shape == (200, 50) and np.all(counts.sum(axis=1) == 50)


def test_corpus_bleu_from_statistics_equals_the_toolkit():
    ids = list(GTS)
    stats = bleu_statistics(GTS, RES, ids)
    expected, _ = Bleu(4).compute_score(GTS, RES, verbose=0)
    got = [corpus_bleu(stats.sum(axis=0)[None], n)[0] for n in range(1, 5)]
    assert got == pytest.approx(expected, rel=1e-12)


def test_each_resample_bleu_equals_rescoring_the_resampled_text():
    ids = list(GTS)
    stats = bleu_statistics(GTS, RES, ids)
    counts = resample_counts(len(ids), 5, seed=11)
    for row in counts:
        gts, res = {}, {}
        for image_id, times in zip(ids, row, strict=True):
            for copy in range(int(times)):  # a drawn-twice image is two images of the resample
                gts[(image_id, copy)], res[(image_id, copy)] = GTS[image_id], RES[image_id]
        expected, _ = Bleu(4).compute_score(gts, res, verbose=0)
        got = [corpus_bleu((row @ stats)[None], n)[0] for n in range(1, 5)]
        assert got == pytest.approx(expected, rel=1e-12)


def test_bleu_is_compared_at_corpus_level():
    ids = list(GTS)
    worse = {i: [RES[i][0].split()[0]] for i in ids}  # one word each: matches, but a short corpus
    result = group_bootstrap(
        [{}],
        [{}],
        [bleu_statistics(GTS, RES, ids)],
        [bleu_statistics(GTS, worse, ids)],
        resamples=100,
        seed=0,
    )
    assert list(result) == ["BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"]
    expected_a, _ = Bleu(4).compute_score(GTS, RES, verbose=0)
    expected_b, _ = Bleu(4).compute_score(GTS, worse, verbose=0)
    assert result["BLEU-4"].a == pytest.approx(expected_a[3]) and result["BLEU-4"].b == pytest.approx(
        expected_b[3]
    )
    assert result["BLEU-1"].difference < 0


def test_the_interval_and_the_p_value_never_contradict_each_other():
    """On 25 images with a skewed difference (one image far off), 0 lies outside the 95% interval
    exactly when p < 0.05: both come from one test (up to the resamples' granularity)."""
    rng = np.random.default_rng(7)
    resamples = 2000
    for trial in range(40):
        a = rng.uniform(0.0, 1.0, 25)
        b = a + rng.normal(0.04, 0.05, 25)
        b[trial % 25] += rng.choice([-1.0, 1.0]) * 1.5  # a skewed bootstrap
        c = group_bootstrap([{"CIDEr-D": a}], [{"CIDEr-D": b}], resamples=resamples, seed=trial)["CIDEr-D"]
        outside = not (c.ci_low <= 0.0 <= c.ci_high)
        if outside:
            assert c.p_value <= 0.05 + 2 / resamples, (trial, c)
        else:
            assert c.p_value >= 0.05 - 2 / resamples, (trial, c)


def test_an_undefined_metric_is_left_out_and_not_counted_in_holm():
    a, b = np.linspace(0, 1, 20), np.linspace(0, 1, 20) + 0.1
    nan = np.full(20, np.nan)
    both = group_bootstrap(
        [{"CIDEr-D": a, "grounding-mass": nan}], [{"CIDEr-D": b, "grounding-mass": nan}], resamples=500
    )
    alone = group_bootstrap([{"CIDEr-D": a}], [{"CIDEr-D": b}], resamples=500)
    assert list(both) == ["CIDEr-D"]
    assert both["CIDEr-D"].p_holm == alone["CIDEr-D"].p_holm == alone["CIDEr-D"].p_value  # one test, not two


def test_the_table_labels_meteors_per_image_mean():
    from captioning.evaluation.significance import comparison_table

    scores = {"METEOR": np.linspace(0.1, 0.3, 10), "CIDEr-D": np.linspace(0.5, 1.0, 10)}
    comparisons = group_bootstrap([scores], [{k: v + 0.01 for k, v in scores.items()}], resamples=200)
    table = comparison_table(comparisons)
    assert "METEOR (mean/img)" in table and "\nCIDEr-D " in table
