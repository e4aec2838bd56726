"""``evaluate.py --compare`` on faithfulness tables: the rows of seed groups equal an independent
two-level bootstrap (images with their words, and runs), and a tampered table is refused in one line
naming its file and entry before any caption is scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bootstrap_reference import draws, holm
from test_evaluation_tools import evaluate_in_process, files  # noqa: F401
from test_faults import assert_one_line_error

RESAMPLES, SEED = 400, 3


def write_run(folder: Path, captions: dict[int, str], table) -> Path:
    """``folder/test_results.json`` with ``table`` as the faithfulness of the scores beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "test_results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in captions.items()]))
    (folder / "test_scores.json").write_text(json.dumps({"faithfulness": table}))
    return results


def table_of(image_ids: list[int], rng: np.random.Generator, shift: float) -> dict:
    """A table of one method whose per-image areas vary, images of 1 to 5 words (rows out of id order)."""
    rows = [
        {
            "image_id": i,
            "words": int(rng.integers(1, 6)),
            "random": {
                "deletion_auc": float(rng.uniform(0.5, 0.7)),
                "insertion_auc": float(rng.uniform(0.3, 0.5)),
            },
            "occlusion": {
                "deletion_auc": float(rng.uniform(0.1, 0.5) + shift),
                "insertion_auc": float(rng.uniform(0.5, 0.9)),
            },
        }
        for i in image_ids
    ]
    return {"methods": {"occlusion": {}}, "per_image": rows[::-1]}


def reference(
    tables_a: list[dict], tables_b: list[dict], key: tuple[str, str]
) -> tuple[float, float, float, float]:
    """B - A of the runs' mean word-weighted areas, its interval and p-value: images drawn with their
    words (the same draws for every run), each side's runs drawn with replacement from their own
    generator (seed, group + 1), as plain loops."""
    name, curve = key
    image_ids = sorted(row["image_id"] for row in tables_a[0]["per_image"])

    def per_image(table: dict) -> tuple[list[float], list[int]]:
        rows = {row["image_id"]: row for row in table["per_image"]}
        words = [rows[i]["words"] for i in image_ids]
        return [rows[i][name][f"{curve}_auc"] * rows[i]["words"] for i in image_ids], words

    def mean(table: dict, drawn) -> float:
        sums, words = per_image(table)
        return sum(sums[i] for i in drawn) / sum(words[i] for i in drawn)

    every = range(len(image_ids))
    difference = np.mean([mean(t, every) for t in tables_b]) - np.mean([mean(t, every) for t in tables_a])
    images = draws(len(image_ids), RESAMPLES, SEED)
    runs = [np.random.default_rng([SEED, group + 1]).integers(0, len(side), size=(RESAMPLES, len(side)))
            for group, side in enumerate((tables_a, tables_b))]  # fmt: skip
    shifted = []
    for r in range(RESAMPLES):
        side_means = [
            np.mean([mean(side[k], images[r]) for k in runs[g][r]])
            for g, side in enumerate((tables_a, tables_b))
        ]
        shifted.append(abs(side_means[1] - side_means[0] - difference))
    half = float(np.percentile(shifted, 95))
    p = (1 + sum(1 for s in shifted if s >= abs(difference) - 1e-9)) / (RESAMPLES + 1)
    return difference, difference - half, difference + half, p


def test_seed_groups_equal_an_independent_two_level_bootstrap(files, tmp_path):  # noqa: F811
    captions = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    rng = np.random.default_rng(11)
    tables = {
        name: table_of(list(captions), rng, shift)
        for name, shift in (("a1", 0.0), ("a2", 0.05), ("b1", 0.2), ("b2", 0.1))
    }
    runs = {name: write_run(tmp_path / name, captions, table) for name, table in tables.items()}
    out = tmp_path / "seeds.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare", str(runs["a1"]), str(runs["a2"]), "--against", str(runs["b1"]), str(runs["b2"]),
        "--annotations", str(files["refs"]), "--no-java", "--resamples", str(RESAMPLES), "--seed", str(SEED),
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    rows = json.loads(out.read_text())["faithfulness"]
    keys = [(name, curve) for name in ("occlusion", "random") for curve in ("deletion", "insertion")]
    expected = {
        key: reference([tables["a1"], tables["a2"]], [tables["b1"], tables["b2"]], key) for key in keys
    }
    for key, (difference, low, high, p) in expected.items():
        row = rows[" ".join(key)]
        assert row["difference"] == pytest.approx(difference)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))
        assert row["p_value"] == pytest.approx(p)
    adjusted = holm([expected[key][3] for key in keys])
    assert [rows[" ".join(key)]["p_holm"] for key in keys] == pytest.approx(adjusted)
    assert rows["occlusion deletion"]["p_holm"] < 0.05  # B's maps delete worse by 0.125 on average


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


ROW0, ROW4 = "per_image[0].occlusion", "per_image[4].occlusion"
TAMPERED = {
    "no-image-id": (lambda t: t["per_image"][2].pop("image_id"), "per_image[2].image_id"),
    "list-image-id": (lambda t: t["per_image"][1].update(image_id=[1, 2]), "per_image[1].image_id"),
    "string": (lambda t: t["per_image"][0]["occlusion"].update(deletion_auc="1"), f"{ROW0}.deletion_auc"),
    "missing-area": (lambda t: t["per_image"][3]["random"].pop("insertion_auc"), "per_image[3].random"),
    "null-area": (lambda t: t["per_image"][4]["occlusion"].update(deletion_auc=None), f"{ROW4}.deletion_auc"),
    "per-image-numbers": (lambda t: t.update(per_image=[1, 2, 3]), "per_image[0]"),
    "per-image-object": (lambda t: t.update(per_image={"a": 1}), "per_image"),
    "methods-list": (lambda t: t.update(methods=["occlusion"]), "methods"),
    "no-method-entry": (lambda t: t["per_image"][5].pop("occlusion"), "per_image[5].occlusion"),
    "zero-words": (lambda t: t["per_image"][6].update(words=0), "per_image[6].words"),
    # areas of probability curves lie in [0, 1]; a row's words are one caption's: bounded as decoding is
    "huge-area": (
        lambda t: t["per_image"][0]["occlusion"].update(deletion_auc=1e308),
        ROW0 + ".deletion_auc",
    ),
    "negative-area": (
        lambda t: t["per_image"][4]["occlusion"].update(insertion_auc=-5),
        ROW4 + ".insertion_auc",
    ),
    "huge-words": (lambda t: t["per_image"][3].update(words=10**300), "per_image[3].words"),
    "many-words": (lambda t: t["per_image"][3].update(words=501), "per_image[3].words"),
    "no-rows": (lambda t: t.update(per_image=[]), "per_image holds no image"),
    "other-images": (
        lambda t: [row.update(image_id=row["image_id"] + 10**6) for row in t["per_image"]],
        "per_image shares no image",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", [*TAMPERED, "nan-area", "deep", "not-json"])
def test_a_tampered_table_is_refused_before_any_scoring(files, tmp_path, case):  # noqa: F811
    captions = {e["image_id"]: e["caption"] for e in json.loads(files["a"].read_text())}
    rng = np.random.default_rng(5)
    good = write_run(tmp_path / "a", captions, table_of(list(captions), rng, 0.0))
    table = table_of(list(captions), rng, 0.1)
    table["per_image"].sort(key=lambda row: row["image_id"])
    bad = write_run(tmp_path / "b", captions, table)
    scores = tmp_path / "b" / "test_scores.json"
    if case in TAMPERED:
        tamper, entry = TAMPERED[case]
        tamper(table)
        scores.write_text(json.dumps({"faithfulness": table}))
        needles = [str(scores), f"faithfulness.{entry}"]
    elif case == "nan-area":  # JSON's NaN, as Python writes it
        table["per_image"][7]["occlusion"]["deletion_auc"] = float("nan")
        scores.write_text(json.dumps({"faithfulness": table}))
        needles = [str(scores), "faithfulness.per_image[7].occlusion.deletion_auc", "nan"]
    elif case == "deep":
        scores.write_text('{"faithfulness": {"per_image": ' + deep(100_000) + "}}")
        needles = [str(scores), "nested too deeply"]
    else:
        scores.write_text('{"faithfulness": {"per_image": [')
        needles = [str(scores), "not valid JSON"]
    out = tmp_path / "comparison.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare", str(good), str(bad), "--annotations", str(files["refs"]), "--no-java", "--out", str(out),
    )  # fmt: skip
    assert_one_line_error(code, stderr, *needles)
    assert "BLEU-1" not in stdout and not out.exists()  # refused before any caption was scored
