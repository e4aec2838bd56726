"""Significance for what matters here: Holm's correction, grounding and CHAIR in the paired bootstrap,
seeds against seeds, ``--names``, and ``--aggregate``'s interval and its refusal to mix decoders."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_evaluation_tools import evaluate, evaluate_in_process, files, shape_of, write_run  # noqa: F401
from test_faults import assert_one_line_error

from captioning.config import Config, TransformerDecoderConfig
from captioning.config.loading import save_config
from captioning.evaluation.grounding import Instances, ObjectBox
from captioning.evaluation.runner import add_boxed_scores
from captioning.evaluation.signature import parse_signature
from captioning.evaluation.significance import group_bootstrap, holm


def test_holm_known_values():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.01, 0.02, 0.03, 0.04, 0.05]) == pytest.approx([0.05, 0.08, 0.09, 0.09, 0.09])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = holm([0.02, float("nan"), 0.01])  # NaN is not a test: two tests, not three
    assert adjusted[0] == pytest.approx(0.02) and np.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)


def test_groups_of_copies_are_the_bootstrap_of_one_run_a_side():
    rng = np.random.default_rng(3)
    a, b = rng.gamma(2.0, 0.4, size=(2, 60))
    ratio_a, ratio_b = rng.integers(0, 3, size=(2, 60, 2)).astype(float)
    single = group_bootstrap(
        [{"CIDEr-D": a}],
        [{"CIDEr-D": b}],
        resamples=500,
        seed=5,
        ratios_a=[{"CHAIR-i": ratio_a}],
        ratios_b=[{"CHAIR-i": ratio_b}],
    )
    copies = group_bootstrap(
        [{"CIDEr-D": a}] * 3,
        [{"CIDEr-D": b}] * 2,
        resamples=500,
        seed=5,
        ratios_a=[{"CHAIR-i": ratio_a}] * 3,
        ratios_b=[{"CHAIR-i": ratio_b}] * 2,
    )
    for metric in single:  # identical seeds add no variance (equal up to the rounding of their mean)
        assert copies[metric].to_json() == pytest.approx(single[metric].to_json(), rel=1e-12)
    assert single["CHAIR-i"].a == pytest.approx(ratio_a[:, 0].sum() / ratio_a[:, 1].sum())


def test_seeds_against_seeds_interval_holds_the_seed_variance():
    """Every image scores its run's value, so the images add no variance: only the seeds do.

    A's runs score 0.1 and 0.3, B's 0.5 and 0.7. Drawing two runs a side with replacement, the mean
    difference is 0.2 with probability 1/16 (A draws 0.3 twice, B 0.5 twice) and 0.6 with 1/16: the
    95% interval is [0.2, 0.6] around the observed 0.4. One run a side has no interval at all.
    """
    images = 30
    run = {value: {"CIDEr-D": np.full(images, value)} for value in (0.1, 0.3, 0.5, 0.7)}
    groups = group_bootstrap([run[0.1], run[0.3]], [run[0.5], run[0.7]], resamples=4000, seed=1)["CIDEr-D"]
    assert (groups.a, groups.b, groups.difference) == pytest.approx((0.2, 0.6, 0.4))
    assert (groups.ci_low, groups.ci_high) == pytest.approx((0.2, 0.6))
    single = group_bootstrap([run[0.1]], [run[0.5]], resamples=4000, seed=1)["CIDEr-D"]
    assert (single.ci_low, single.ci_high) == pytest.approx((0.4, 0.4))


def test_per_image_grounding_adds_up_to_the_overall_score():
    boxes = Instances(
        {1: (40.0, 40.0), 2: (40.0, 40.0), 3: (40.0, 40.0)},
        {1: [ObjectBox("circle", (0, 0, 20, 20))], 2: [ObjectBox("square", (20, 20, 20, 20))], 3: []},
    )
    words = {1: ["a", "circle"], 2: ["a", "square", "and", "a", "square"], 3: ["a", "circle"]}
    top_left, everywhere = np.array([1.0, 0, 0, 0]), np.full(4, 0.25)
    attention = {
        1: (np.stack([everywhere, top_left]), (2, 2)),
        2: (np.stack([everywhere, top_left, everywhere, everywhere, everywhere]), (2, 2)),
        3: (np.stack([everywhere, top_left]), (2, 2)),
    }
    result = {"per_image": [{"image_id": i} for i in (1, 2, 3)]}
    add_boxed_scores(result, boxes, words, {1: [], 2: [], 3: []}, attention)
    per_image = {entry["image_id"]: entry for entry in result["per_image"]}
    assert per_image[1]["grounding-mass"] == 1.0 and per_image[1]["grounding-words"] == 1
    assert (
        per_image[2]["grounding-mass"] == pytest.approx((0.0 + 0.25) / 2)
        and per_image[2]["grounding-words"] == 2
    )
    assert per_image[3]["grounding-words"] == 0 and per_image[3]["grounding-mass"] is None
    assert result["grounding-mass"] == pytest.approx((1.0 + 0.0 + 0.25) / 3)  # every mention weighs the same
    assert per_image[2]["CHAIR-mentions"] == 2 and per_image[3]["hallucinated"] == ["circle"]


def write_system(
    folder: Path,
    captions: dict[int, str],
    grounding_mass: float | None = None,
    published: Callable[[int], tuple[str, float]] = lambda i: ("dog", 1.0),
) -> Path:
    """``folder/test_results.json``, and beside it per-image scores with one grounded mention an image
    (``published``: image id -> the mention's class and its published pointing hit)."""
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "test_results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in captions.items()]))
    if grounding_mass is not None:
        entries = [
            {
                "image_id": i,
                "CIDEr-D": 0.0,
                "grounding-mass": grounding_mass,
                "grounding-pointing": 1.0,
                "grounding-pointing-published": published(i)[1],
                "grounding-classes": {published(i)[0]: [published(i)[1], 1]},
                "grounding-words": 1,
            }
            for i in captions
        ]
        (folder / "test_scores.per_image.json").write_text(json.dumps(entries))
    return results


def test_compare_names_columns_and_brings_grounding_and_chair(files, tmp_path):  # noqa: F811
    good = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    bad = {e["image_id"]: e["caption"] for e in json.loads(files["b"].read_text())}
    # A: a dog mention hit on 3 of 4 images, a cat mention missed on the 4th: 0.75 per mention, 0.5 per
    # class; B: dogs hit everywhere, 1.0 both ways.
    lstm = write_system(tmp_path / "lstm", good, 0.8, lambda i: ("dog", 1.0) if i % 4 else ("cat", 0.0))
    transformer = write_system(tmp_path / "tf", bad, 0.4)
    out = tmp_path / "comparison.json"
    result = evaluate(
        "--compare",
        str(lstm),
        str(transformer),
        "--annotations",
        str(files["refs"]),
        "--instances",
        str(files["instances"]),
        "--no-java",
        "--resamples",
        "300",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    header = result.stdout.splitlines()[0].split()
    assert header[1:3] == ["lstm", "tf"]  # both files are test_results.json: their folders name them
    comparison = json.loads(out.read_text())
    metrics = comparison["metrics"]
    assert metrics["grounding-mass"]["difference"] == pytest.approx(-0.4)
    assert metrics["grounding-pointing"]["difference"] == pytest.approx(0.0)
    assert metrics["grounding-pointing-published"]["a"] == pytest.approx(0.75)
    assert metrics["grounding-pointing-published"]["difference"] == pytest.approx(0.25)
    assert metrics["grounding-pointing-published-mentioned-classes"]["a"] == pytest.approx(0.5)
    assert metrics["grounding-pointing-published-mentioned-classes"]["difference"] == pytest.approx(0.5)
    assert metrics["CHAIR-s"]["difference"] == pytest.approx(0.5)  # B hallucinates on 20 of 40 images
    assert metrics["CHAIR-i"]["b"] == pytest.approx(0.5) and metrics["CHAIR-i"]["ci_low"] > 0
    assert all(m["p_holm"] >= m["p_value"] for m in metrics.values())
    assert f"adjusted for the {len(metrics)} metrics" in result.stdout
    # CHAIR from the captions: table and boxes named
    signature = parse_signature(comparison["signatures"]["a"])
    assert signature["chair"] == "released" and "inst" in signature and "words" in signature
    extended = evaluate(
        "--compare",
        str(lstm),
        str(transformer),
        "--annotations",
        str(files["refs"]),
        "--instances",
        str(files["instances"]),
        "--chair-table",
        "extended",
        "--no-java",
        "--resamples",
        "50",
        "--out",
        str(tmp_path / "extended.json"),
    )
    assert extended.returncode == 0, extended.stderr[-2000:]
    other = parse_signature(json.loads((tmp_path / "extended.json").read_text())["signatures"]["a"])
    assert other["chair"] == "extended" and other["words"] != signature["words"]
    named = evaluate(
        "--compare",
        str(lstm),
        str(transformer),
        "--names",
        "LSTM",
        "Transformer",
        "--annotations",
        str(files["refs"]),
        "--no-java",
        "--resamples",
        "50",
    )
    assert named.returncode == 0, named.stderr[-2000:]
    assert named.stdout.splitlines()[0].split()[1:3] == ["LSTM", "Transformer"]
    # no CHAIR per image, no --instances
    assert "grounding-mass" in named.stdout and "CHAIR-s" not in named.stdout


def test_per_image_chair_written_by_evaluate_is_compared(files, tmp_path):  # noqa: F811
    for name in ("a", "b"):
        code, _, stderr = evaluate_in_process(
            "--annotations",
            str(files["refs"]),
            "--results",
            str(files[name]),
            "--instances",
            str(files["instances"]),
            "--no-java",
        )
        assert code == 0, stderr
    out = tmp_path / "comparison.json"
    code, _, stderr = evaluate_in_process(
        "--compare",
        str(files["a"]),
        str(files["b"]),
        "--annotations",
        str(files["refs"]),
        "--no-java",
        "--resamples",
        "100",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["CHAIR-i"]["a"] == 0.0 and metrics["CHAIR-i"]["b"] == pytest.approx(0.5)
    assert "grounding-mass" not in metrics  # a results file has no attention to ground


def test_seed_groups_through_the_command_line(files, tmp_path):  # noqa: F811
    good = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    bad = {e["image_id"]: e["caption"] for e in json.loads(files["b"].read_text())}
    slightly_off = {i: (c if i % 4 else "a shape") for i, c in good.items()}
    runs_a = [write_system(tmp_path / "a1", good), write_system(tmp_path / "a2", slightly_off)]
    runs_b = [write_system(tmp_path / "b1", bad), write_system(tmp_path / "b2", good)]
    out = tmp_path / "seeds.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare",
        *map(str, runs_a),
        "--against",
        *map(str, runs_b),
        "--annotations",
        str(files["refs"]),
        "--no-java",
        "--resamples",
        "200",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    comparison = json.loads(out.read_text())
    assert comparison["runs"] == {"a": 2, "b": 2} and comparison["names"] == {"a": "A", "b": "B"}
    assert comparison["results"]["a"] == [str(p) for p in runs_a]
    per_run = comparison["per_run"]
    cider = comparison["metrics"]["CIDEr-D"]
    assert cider["a"] == pytest.approx(np.mean(per_run["a"]["CIDEr-D"]))
    assert cider["difference"] == pytest.approx(
        np.mean(per_run["b"]["CIDEr-D"]) - np.mean(per_run["a"]["CIDEr-D"])
    )
    assert cider["ci_low"] < cider["difference"] < cider["ci_high"]
    assert "2 runs of A, 2 of B" in stdout and "variance between seeds" in stdout


def test_seed_groups_bootstrap_the_faithfulness_rows(files, tmp_path):  # noqa: F811
    """Each run's occlusion maps delete its words as well on every image (A's seeds 0.1 and 0.3, B's
    0.5 and 0.7): the images add no variance, the seeds do, so the interval is the seed groups' one
    (as in ``test_seeds_against_seeds_interval_holds_the_seed_variance``), not a point."""
    captions = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    runs = {}
    for name, deletion in (("a1", 0.1), ("a2", 0.3), ("b1", 0.5), ("b2", 0.7)):
        runs[name] = write_system(tmp_path / name, captions)
        per_image = [
            {
                "image_id": i,
                "random": {"deletion_auc": 0.6, "insertion_auc": 0.4},
                "occlusion": {"deletion_auc": deletion, "insertion_auc": 0.7},
            }
            for i in captions
        ]
        table = {"methods": {"occlusion": {}}, "per_image": per_image}
        (tmp_path / name / "test_scores.json").write_text(json.dumps({"faithfulness": table}))
    out = tmp_path / "seeds.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare", str(runs["a1"]), str(runs["a2"]), "--against", str(runs["b1"]), str(runs["b2"]),
        "--annotations", str(files["refs"]), "--no-java", "--resamples", "2000", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    assert f"faithfulness of the maps, {len(captions)} images explained by all 4 runs" in stdout
    rows = json.loads(out.read_text())["faithfulness"]
    assert set(rows) == {"occlusion deletion", "occlusion insertion", "random deletion", "random insertion"}
    deletion = rows["occlusion deletion"]
    assert (deletion["a"], deletion["b"], deletion["difference"]) == pytest.approx((0.2, 0.6, 0.4))
    assert (deletion["ci_low"], deletion["ci_high"]) == pytest.approx((0.2, 0.6))
    assert rows["occlusion insertion"]["difference"] == pytest.approx(0.0)
    # one run of B without a table: no rows, and the output says why
    (tmp_path / "b2" / "test_scores.json").unlink()
    code, stdout, stderr = evaluate_in_process(
        "--compare", str(runs["a1"]), str(runs["a2"]), "--against", str(runs["b1"]), str(runs["b2"]),
        "--annotations", str(files["refs"]), "--no-java", "--resamples", "200", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    assert "not compared, the scores of some runs hold no table" in stdout
    assert "faithfulness" not in json.loads(out.read_text())


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--against", "b.json"], "--against goes with --compare"),
        (["--compare", "a.json", "b.json", "c.json"], "--compare takes two results files (A B), got 3"),
        (["--compare", "a.json", "--against", "a.json"], "a.json: given twice"),
    ],
    ids=["against-alone", "three-files", "twice"],
)
def test_compare_group_arguments_are_checked(files, tmp_path, extra, needle):  # noqa: F811
    args = [str(files[arg[0]]) if arg in ("a.json", "b.json") else arg for arg in extra]
    code, _, stderr = evaluate_in_process(*args, "--annotations", str(files["refs"]), "--no-java")
    assert_one_line_error(code, stderr, needle)


def test_aggregate_interval_of_the_mean(tmp_path):
    paths = [
        write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": cider})
        for seed, cider in ((1, 0.5), (2, 0.7), (3, 0.9))
    ]
    out = tmp_path / "aggregate.json"
    code, stdout, stderr = evaluate_in_process("--aggregate", *map(str, paths), "--out", str(out))
    assert code == 0, stderr
    cider = json.loads(out.read_text())["metrics"]["CIDEr-D"]
    half = 4.302652729911275 * 0.2 / np.sqrt(3)  # t(0.975, 2) * std / sqrt(n)
    assert (cider["ci_low"], cider["ci_high"]) == pytest.approx((0.7 - half, 0.7 + half))
    assert "95% interval" in stdout and f"{100 * (0.7 - half):7.2f}" in stdout


def test_aggregate_intervals_of_two_seeds_stay_in_the_metrics_range_and_say_so(tmp_path):
    paths = [
        write_run(tmp_path / f"seed{seed}", seed, {"BLEU-4": bleu, "CIDEr-D": cider, "CHAIR-i": chair})
        for seed, bleu, cider, chair in ((1, 0.2, 4.7, 0.01), (2, 0.9, 4.8, 0.02))
    ]
    out = tmp_path / "aggregate.json"
    code, stdout, stderr = evaluate_in_process("--aggregate", *map(str, paths), "--out", str(out))
    assert code == 0, stderr
    metrics = json.loads(out.read_text())["metrics"]
    # t(0.975, 1) = 12.7: BLEU-4's 0.55 +- 4.45 and CHAIR-i's 0.015 +- 0.064 pass [0, 1]
    assert (metrics["BLEU-4"]["ci_low"], metrics["BLEU-4"]["ci_high"]) == (0.0, 1.0)
    assert metrics["BLEU-4"]["clipped"] is True and metrics["CHAIR-i"]["ci_low"] == 0.0
    half = 12.706204736174707 * np.std([4.7, 4.8], ddof=1) / np.sqrt(2)  # within CIDEr-D's [0, 10]
    assert (metrics["CIDEr-D"]["ci_low"], metrics["CIDEr-D"]["ci_high"]) == pytest.approx(
        (4.75 - half, 4.75 + half)
    )
    assert "clipped" not in metrics["CIDEr-D"]
    lines = stdout.splitlines()
    assert next(line for line in lines if line.startswith("BLEU-4 ")).endswith("[   0.00,  100.00]*")
    assert next(line for line in lines if line.startswith("CIDEr-D ")).endswith("]")
    assert (
        "* clipped to the metric's range: with n = 2, t(0.975, 1) = 12.7 makes the interval wider" in stdout
    )


def test_aggregate_refusing_different_decoders_names_the_decoder_kind(tmp_path):
    paths = [write_run(tmp_path / "lstm", 1, {"CIDEr-D": 0.5}), tmp_path / "transformer" / "test_scores.json"]
    paths[1].parent.mkdir()
    config = Config()
    decoder = TransformerDecoderConfig(d_model=256)  # d_model sorts before kind, and differs too
    save_config(
        replace(
            config,
            model=replace(config.model, decoder=decoder),
            train=replace(config.train, seed=2, output_dir=str(paths[1].parent)),
        ),
        paths[1].parent / "config.yaml",
    )
    paths[1].write_text(json.dumps({"CIDEr-D": 0.6}))
    code, _, stderr = evaluate_in_process("--aggregate", *map(str, paths))
    assert_one_line_error(
        code,
        stderr,
        str(paths[1]),
        "model.decoder.kind",
        "'transformer'",
        "'lstm'",
        str(paths[0]),
        "--compare",
    )


def test_seed_groups_refuse_runs_of_other_images(files, tmp_path):  # noqa: F811
    captions = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    runs_a = [write_system(tmp_path / "a1", captions), write_system(tmp_path / "a2", captions)]
    fewer = write_system(tmp_path / "b2", {i: c for i, c in captions.items() if i != 7})
    code, _, stderr = evaluate_in_process(
        "--compare",
        *map(str, runs_a),
        "--against",
        str(files["b"]),
        str(fewer),
        "--annotations",
        str(files["refs"]),
        "--no-java",
    )
    assert_one_line_error(code, stderr, str(runs_a[0]), "image_id 7", str(fewer))


def test_a_method_only_one_side_explained_is_named_not_dropped(files, tmp_path):  # noqa: F811
    """A's table holds occlusion, B's occlusion and rollout: occlusion is compared, and the output and
    ``--out`` say rollout was not."""
    captions = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    runs = {}
    for name, methods in (("a", ["occlusion"]), ("b", ["occlusion", "rollout"])):
        runs[name] = write_system(tmp_path / name, captions)
        areas = {"deletion_auc": 0.3, "insertion_auc": 0.7}
        per_image = [
            {
                "image_id": i,
                "random": {"deletion_auc": 0.6, "insertion_auc": 0.4},
                **dict.fromkeys(methods, areas),
            }
            for i in captions
        ]
        table = {"methods": dict.fromkeys(methods, {}), "per_image": per_image}
        (tmp_path / name / "test_scores.json").write_text(json.dumps({"faithfulness": table}))
    out = tmp_path / "compared.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare", str(runs["a"]), str(runs["b"]), "--annotations", str(files["refs"]), "--no-java",
        "--resamples", "50", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    written = json.loads(out.read_text())
    assert {key.split()[0] for key in written["faithfulness"]} == {"occlusion", "random"}
    assert written["faithfulness_not_compared"] == ["rollout"]
    assert "not compared (not in every run's table): rollout" in stdout
