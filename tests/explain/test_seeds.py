"""The faithfulness study over training seeds (``evaluate.py --aggregate``): each method's areas and
gaps summarised over the runs, and the paired tests between methods resampling images and runs,
each equal to a computation written here."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import pytest
from test_evaluation_tools import evaluate_in_process, write_run

from captioning.explain.seeds import seeds_lines, seeds_table
from captioning.explain.statistics import BootstrapSettings

T_975_2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)
METHODS = ("attention", "integrated_gradients")


def make_tables(seed: int = 0, images: int = 12) -> list[dict]:
    """Three runs' tables: per image a word count and each method's (and the random order's) areas;
    integrated gradients deletes faster than attention by a run-dependent margin."""
    rng = np.random.default_rng(seed)
    tables = []
    for run in range(3):
        rows = []
        for image in range(images):
            row: dict = {"image_id": 100 + image, "words": int(rng.integers(3, 9))}
            base = rng.uniform(0.3, 0.6)
            row["random"] = {"deletion_auc": base + 0.2, "insertion_auc": base}
            row["attention"] = {"deletion_auc": base, "insertion_auc": base - 0.05 * run}
            row["integrated_gradients"] = {
                "deletion_auc": base - 0.05 - 0.03 * run + rng.normal(0, 0.02),
                "insertion_auc": base + 0.1,
            }
            rows.append(row)
        tables.append({"methods": {name: {} for name in METHODS}, "per_image": rows})
    return tables


def word_mean(rows: list[dict], name: str, curve: str, images: list[int]) -> float:
    by_id = {row["image_id"]: row for row in rows}
    total = sum(by_id[i]["words"] * by_id[i][name][f"{curve}_auc"] for i in images)
    return total / sum(by_id[i]["words"] for i in images)


def test_summaries_over_seeds_are_the_runs_word_means():
    tables = make_tables()
    table = seeds_table(tables, BootstrapSettings(resamples=200, seed=1))
    images = [row["image_id"] for row in tables[0]["per_image"]]
    assert table["runs"] == 3 and table["images"] == len(images)
    for name in (*METHODS, "random"):
        for curve in ("deletion", "insertion"):
            per_run = [word_mean(t["per_image"], name, curve, images) for t in tables]
            summary = table["methods"][name][f"{curve}_auc"]
            mean, std = float(np.mean(per_run)), float(np.std(per_run, ddof=1))
            assert summary["per_run"] == pytest.approx(per_run)
            assert (summary["mean"], summary["std"]) == pytest.approx((mean, std))
            half = T_975_2 * std / np.sqrt(3)
            assert (summary["ci_low"], summary["ci_high"]) == pytest.approx((mean - half, mean + half))
    gap = table["methods"]["attention"]["deletion_gap"]["per_run"]
    random = [word_mean(t["per_image"], "random", "deletion", images) for t in tables]
    attention = [word_mean(t["per_image"], "attention", "deletion", images) for t in tables]
    assert gap == pytest.approx(np.subtract(random, attention))


def loop_bootstrap(tables: list[dict], a: str, b: str, curve: str, resamples: int, seed: int):
    """The paired bootstrap over images and runs, one resample at a time: the images drawn (shared by
    the runs), then k runs with replacement, the same for both methods."""
    ids = [row["image_id"] for row in tables[0]["per_image"]]
    image_draws = np.random.default_rng(seed).integers(0, len(ids), size=(resamples, len(ids)))
    run_draws = np.random.default_rng([seed, 1]).integers(0, len(tables), size=(resamples, len(tables)))
    observed = np.mean(
        [word_mean(t["per_image"], b, curve, ids) - word_mean(t["per_image"], a, curve, ids) for t in tables]
    )
    boot = []
    for r in range(resamples):
        drawn = [ids[i] for i in image_draws[r]]  # with repeats: each counts as often as drawn
        differences = []
        for run in run_draws[r]:
            rows = {row["image_id"]: row for row in tables[run]["per_image"]}
            means = []
            for name in (b, a):
                total = sum(rows[i]["words"] * rows[i][name][f"{curve}_auc"] for i in drawn)
                means.append(total / sum(rows[i]["words"] for i in drawn))
            differences.append(means[0] - means[1])
        boot.append(np.mean(differences))
    boot = np.array(boot)
    p_value = (1 + np.count_nonzero(np.abs(boot - observed) >= abs(observed) - 1e-9)) / (resamples + 1)
    half = np.percentile(np.abs(boot - observed), 95)
    return observed, observed - half, observed + half, p_value


def test_paired_tests_equal_a_loop_over_images_and_runs_and_are_holm_adjusted():
    tables = make_tables(seed=4)
    settings = BootstrapSettings(resamples=300, seed=7)
    table = seeds_table(tables, settings)
    tests = {(t["curve"], t["a"], t["b"]): t for t in table["tests"]}
    pairs = [*combinations(METHODS, 2), *((name, "random") for name in METHODS)]
    assert set(tests) == {(curve, a, b) for a, b in pairs for curve in ("deletion", "insertion")}
    p_values = []
    for a, b in pairs:
        for curve in ("deletion", "insertion"):
            observed, low, high, p_value = loop_bootstrap(
                tables, a, b, curve, settings.resamples, settings.seed
            )
            test = tests[(curve, a, b)]
            assert (test["difference"], test["ci_low"], test["ci_high"]) == pytest.approx(
                (observed, low, high)
            )
            assert test["p_value"] == pytest.approx(p_value)
            p_values.append((test["p_value"], test["p_holm"]))
    # Holm over the 6 tests (one pair and two against random, two curves): the smallest p-value times 6
    assert len(p_values) == 6
    smallest = min(p_values)
    assert smallest[1] == pytest.approx(min(1.0, 6 * smallest[0]))
    deletion = tests[("deletion", "attention", "integrated_gradients")]
    assert deletion["difference"] < 0 and deletion["more_faithful"] == "integrated_gradients"


def test_aggregate_prints_and_writes_the_faithfulness_over_seeds(tmp_path):
    tables = make_tables(seed=2)
    paths = []
    for seed, table in enumerate(tables):
        path = write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": 0.5 + 0.1 * seed})
        scores = json.loads(path.read_text())
        path.write_text(json.dumps({**scores, "faithfulness": table}))
        paths.append(path)
    out = tmp_path / "aggregate.json"
    code, stdout, stderr = evaluate_in_process(
        "--aggregate", *map(str, paths), "--resamples", "100", "--out", str(out)
    )
    assert code == 0, stderr
    written = json.loads(out.read_text())["faithfulness"]
    assert written == json.loads(json.dumps(seeds_table(tables, BootstrapSettings(resamples=100, seed=0))))
    assert "faithfulness over 3 seeds, 12 images each" in stdout
    assert "deletion  attention vs integrated_gradients" in stdout
    # a run without a table: nothing aggregated, and the output names it
    paths[1].write_text(json.dumps({"CIDEr-D": 0.6}))
    code, stdout, stderr = evaluate_in_process("--aggregate", *map(str, paths), "--out", str(out))
    assert code == 0, stderr
    assert f"not aggregated, no table in {paths[1]}" in stdout
    assert "faithfulness" not in json.loads(out.read_text())


def test_aggregate_refuses_a_malformed_table_naming_file_and_entry(tmp_path):
    tables = make_tables(seed=2)
    paths = []
    for seed, table in enumerate(tables):
        path = write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": 0.5})
        paths.append(path)
        if seed == 2:
            table["per_image"][3]["attention"]["deletion_auc"] = "high"
        path.write_text(json.dumps({"CIDEr-D": 0.5, "faithfulness": table}))
    code, _, stderr = evaluate_in_process("--aggregate", *map(str, paths))
    assert code != 0
    last = stderr.strip().splitlines()[-1]
    assert str(paths[2]) in last and "per_image[3]" in last and "deletion_auc" in last


def test_a_table_whose_tests_cannot_reach_5_percent_says_so():
    """72 tests (8 methods) of 1000 resamples: the smallest p-value 1/1001 times 72 is 0.072, so no
    pair can be called whatever the maps; the console says so and what to give instead."""
    from captioning.explain.split import table_lines
    from captioning.explain.statistics import floor_warning, smallest_p_holm

    assert smallest_p_holm(72, 1000) == pytest.approx(72 / 1001)
    assert smallest_p_holm(30, 10000) == pytest.approx(30 / 10001)
    warning = floor_warning(72, 1000)
    assert warning is not None and "0.0719" in warning and "--resamples 7200" in warning
    assert floor_warning(30, 1000) is None  # 0.03: a test can be called
    random = {"deletion_auc": 0.8, "insertion_auc": 0.8}
    for resamples, expected in ((1000, True), (10000, False)):
        settings = BootstrapSettings(resamples=resamples).describe(72)
        result = {"random": random, "methods": {}, "statistics": settings, "images": 2}
        assert any("no p Holm can fall below" in line for line in table_lines(result)) is expected
    table = seeds_table(make_tables(), BootstrapSettings(resamples=50))  # 6 tests, floor 6/51
    assert any("no p Holm can fall below 0.118" in line for line in seeds_lines(table))


def test_a_method_only_some_runs_explained_is_named_not_dropped():
    tables = make_tables(seed=5)
    for row in tables[1]["per_image"]:
        row["occlusion"] = {"deletion_auc": 0.5, "insertion_auc": 0.5}
    tables[1]["methods"]["occlusion"] = {}
    table = seeds_table(tables, BootstrapSettings(resamples=20))
    assert table["not_compared"] == ["occlusion"] and "occlusion" not in table["methods"]
    assert "not compared (not in every run's table): occlusion" in seeds_lines(table)
