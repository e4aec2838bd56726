"""The faithfulness table's intervals, n and paired tests equal an independent bootstrap over images
(``bootstrap_reference``: plain loops over the same draws) of fixed per-word areas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bootstrap_reference import holm, paired_test, percentile_interval
from messages import raises_naming

from captioning.explain.faithfulness import WordCurves, summarise
from captioning.explain.statistics import BootstrapSettings, add_statistics, number_of_tests
from captioning.utils.errors import InputError

RESAMPLES, SEED = 300, 7


def flat(areas: np.ndarray) -> WordCurves:
    """Curves whose areas are ``areas``: two equal points each."""
    curve = torch.from_numpy(np.repeat(areas[:, None], 2, axis=1))
    return WordCurves(curve, curve.clone())


def fixed_study():
    """13 images (ids out of order) of 1 to 4 words; two methods, three random seeds."""
    rng = np.random.default_rng(3)
    ids = [30, 10, 20, 50, 40, 60, 70, 5, 15, 25, 35, 45, 55]
    word_images = [image for image in ids for _ in range(int(rng.integers(1, 5)))]
    count = len(word_images)
    deletion = {"attention": rng.uniform(0.2, 0.6, count), "occlusion": rng.uniform(0.1, 0.4, count)}
    insertion = {"attention": rng.uniform(0.4, 0.8, count), "occlusion": rng.uniform(0.5, 0.9, count)}
    seeds = [(rng.uniform(0.4, 0.7, count), rng.uniform(0.3, 0.6, count)) for _ in range(3)]
    return word_images, deletion, insertion, seeds


def image_sums(
    values: np.ndarray, word_images: list[int], select: np.ndarray
) -> tuple[list[float], list[int]]:
    """Per image (in id order) with a selected word: the sum of its selected words' values, their number."""
    images = sorted({image for image, chosen in zip(word_images, select, strict=True) if chosen})
    sums = [
        sum(v for v, i, c in zip(values, word_images, select, strict=True) if c and i == image)
        for image in images
    ]
    words = [sum(1 for i, c in zip(word_images, select, strict=True) if c and i == image) for image in images]
    return sums, words


@pytest.mark.parametrize("which", ["all", "some"])
def test_intervals_and_tests_equal_an_independent_bootstrap(which: str):
    word_images, deletion, insertion, seeds = fixed_study()
    select = np.ones(len(word_images), dtype=bool)
    if which == "some":  # a word class: every third word, so some images have none
        select = np.arange(len(word_images)) % 3 == 0
    per_method = {
        name: WordCurves(flat(deletion[name]).deletion, flat(insertion[name]).insertion) for name in deletion
    }
    control = [WordCurves(flat(d).deletion, flat(i).insertion) for d, i in seeds]
    rows = summarise(per_method, control, torch.from_numpy(select))
    areas = {name: (deletion[name], insertion[name]) for name in deletion}
    paired = add_statistics(rows, areas, seeds, word_images, select, BootstrapSettings(RESAMPLES, SEED))

    random_values = {
        "deletion": np.mean([d for d, _ in seeds], axis=0),
        "insertion": np.mean([i for _, i in seeds], axis=0),
    }
    values = {"deletion": deletion, "insertion": insertion}
    random_sums = {curve: image_sums(random_values[curve], word_images, select) for curve in values}
    images = len(random_sums["deletion"][1])
    assert rows["random"]["images"] == images and rows["random"]["words"] == int(select.sum())
    for k, curve in enumerate(("deletion", "insertion")):
        sums, words = random_sums[curve]
        expected = percentile_interval(sums, words, RESAMPLES, SEED)
        assert rows["random"][f"{curve}_auc_ci"] == pytest.approx(expected)
        assert rows["random"][f"{curve}_auc_seeds"] == pytest.approx([s[k][select].mean() for s in seeds])
    p_values, adjusted_by = [], []
    for name in deletion:
        row = rows[name]
        assert row["images"] == images and row["words"] == int(select.sum())
        for curve in ("deletion", "insertion"):
            sums, words = image_sums(values[curve][name], word_images, select)
            assert row[f"{curve}_auc"] == pytest.approx(sum(sums) / sum(words))
            assert row[f"{curve}_auc_ci"] == pytest.approx(percentile_interval(sums, words, RESAMPLES, SEED))
            random = random_sums[curve][0]
            a, b = (sums, random) if curve == "deletion" else (random, sums)  # the gap: positive beats chance
            difference, low, high, p = paired_test(a, b, words, RESAMPLES, SEED)
            assert row[f"{curve}_gap"] == pytest.approx(difference)
            assert row[f"{curve}_gap_ci"] == pytest.approx([low, high])
            assert row[f"{curve}_gap_p"] == pytest.approx(p)
            p_values.append(p)
            adjusted_by.append(row[f"{curve}_gap_p_holm"])
    assert len(paired) == 2  # one pair of methods, two curves
    for test in paired:
        assert (test["a"], test["b"]) == ("attention", "occlusion")
        curve = test["curve"]
        sums_a, words = image_sums(values[curve]["attention"], word_images, select)
        sums_b, _ = image_sums(values[curve]["occlusion"], word_images, select)
        difference, low, high, p = paired_test(sums_a, sums_b, words, RESAMPLES, SEED)
        assert test["difference"] == pytest.approx(difference)
        assert [test["ci_low"], test["ci_high"]] == pytest.approx([low, high])
        assert test["p_value"] == pytest.approx(p)
        p_values.append(p)
        adjusted_by.append(test["p_holm"])
        better = (difference < 0) == (curve == "deletion")  # B lower on deletion, higher on insertion
        expected = None if test["p_holm"] >= 0.05 else ("occlusion" if better else "attention")
        assert test["more_faithful"] == expected
    assert len(p_values) == number_of_tests(2)
    assert adjusted_by == pytest.approx(holm(p_values))  # every test of the table adjusted together


def test_occlusion_is_named_more_faithful_when_it_clearly_is():
    word_images, deletion, insertion, seeds = fixed_study()
    select = np.ones(len(word_images), dtype=bool)
    per_method = {
        name: WordCurves(flat(deletion[name]).deletion, flat(insertion[name]).insertion) for name in deletion
    }
    control = [WordCurves(flat(d).deletion, flat(i).insertion) for d, i in seeds]
    rows = summarise(per_method, control, torch.from_numpy(select))
    areas = {name: (deletion[name], insertion[name]) for name in deletion}
    paired = add_statistics(rows, areas, seeds, word_images, select, BootstrapSettings(RESAMPLES, SEED))
    # occlusion's areas are drawn from a lower deletion and a higher insertion range on every word
    assert [test["more_faithful"] for test in paired] == ["occlusion", "occlusion"]


@pytest.mark.parametrize("resamples, seed", [(0, 0), (10, -1), (2.5, 0), (True, 0)])
def test_bootstrap_settings_are_checked(resamples, seed):
    name = "resamples" if resamples in (0, 2.5) or resamples is True else "seed"
    with raises_naming(InputError, name):
        BootstrapSettings(resamples, seed)


def test_grounding_intervals_equal_an_independent_bootstrap_over_images_with_their_mentions():
    from captioning.evaluation.grounding import Instances, ObjectBox
    from captioning.explain.plausibility import Explained, grounding_rows
    from captioning.explain.statistics import grounding_intervals

    # 12 images of 100 x 100 with a dog in the top-left quarter, captions naming it 1 to 3 times;
    # each mention's map puts 0 to 1 of its mass on the dog's cell (grid 2 x 2)
    rng = np.random.default_rng(2)
    ids = list(range(1, 13))
    instances = Instances(
        {i: (100.0, 100.0) for i in ids},
        {i: [ObjectBox("dog", (0.0, 0.0, 50.0, 50.0), {})] for i in ids},
        ("dog",),
    )
    explained, masses = [], []
    for image_id in ids:
        mentions = int(rng.integers(1, 4))
        words = ["a", "dog"] * mentions
        on_dog = rng.uniform(0, 1, mentions)
        maps = np.full((len(words), 4), 0.25)
        maps[1::2] = np.stack([on_dog, *[(1 - on_dog) / 3] * 3], axis=1)
        explained.append(Explained(image_id, words, {"m": maps}, (2, 2)))
        masses.append(on_dog)
    intervals = grounding_intervals(explained, instances, 15.0, BootstrapSettings(RESAMPLES, SEED))["m"]
    sums, counts = [float(m.sum()) for m in masses], [len(m) for m in masses]
    assert intervals["grounding_mass_ci"] == pytest.approx(percentile_interval(sums, counts, RESAMPLES, SEED))
    hits = [float((m > (1 - m) / 3).sum()) for m in masses]  # the strict game: the dog's cell is the top one
    assert intervals["pointing_ci"] == pytest.approx(percentile_interval(hits, counts, RESAMPLES, SEED))
    row = grounding_rows(explained, instances, 15.0)["m"]
    assert row["mass"] == pytest.approx(sum(sums) / sum(counts))  # the row the interval goes with


def test_a_table_of_one_image_has_n_and_no_interval_or_test():
    word_images, deletion, insertion, seeds = fixed_study()
    select = np.array([image == 30 for image in word_images])  # the first image's words only
    per_method = {
        name: WordCurves(flat(deletion[name]).deletion, flat(insertion[name]).insertion) for name in deletion
    }
    control = [WordCurves(flat(d).deletion, flat(i).insertion) for d, i in seeds]
    rows = summarise(per_method, control, torch.from_numpy(select))
    areas = {name: (deletion[name], insertion[name]) for name in deletion}
    paired = add_statistics(rows, areas, seeds, word_images, select, BootstrapSettings(RESAMPLES, SEED))
    assert paired == []
    for row in rows.values():
        assert row["images"] == 1 and row["words"] == int(select.sum())
        assert not [key for key in row if key.endswith(("_ci", "_p", "_p_holm"))]
