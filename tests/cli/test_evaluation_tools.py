"""evaluate.py's --compare, --aggregate and CHAIR with --instances, through the command line.

Each runs ``python evaluate.py`` through the same ``run_cli(main, get_args_parser(), argv)`` call the
script makes, in this process (tests/tool_runs.py); test_end_to_end runs evaluate.py from a shell.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from test_faults import assert_one_line_error
from tool_runs import REPO, in_process

from captioning.config import Config
from captioning.config.loading import save_config
from captioning.evaluation.signature import parse_signature

COLOURS = ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle", "diamond")


def evaluate(*args: str) -> subprocess.CompletedProcess:
    """``python evaluate.py args`` started in the repository, run in this process (tests/tool_runs.py)."""
    return in_process("evaluate.py", *args, cwd=REPO)


def evaluate_in_process(*args: str) -> tuple[int, str, str]:
    """``python evaluate.py args`` in this process: (exit status, stdout, stderr)."""
    result = evaluate(*args)
    return result.returncode, result.stdout, result.stderr


def shape_of(image_id: int) -> tuple[str, str]:
    return COLOURS[image_id % 5], SHAPES[image_id % 4]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """40 Shapes-like images with references and boxes, a good system A and a worse system B."""
    ids = list(range(1, 41))
    references = [
        {"image_id": i, "caption": text}
        for i in ids
        for text in (
            f"a {shape_of(i)[0]} {shape_of(i)[1]} on a white background",
            f"there is a {shape_of(i)[0]} {shape_of(i)[1]}",
        )
    ]
    (tmp_path / "refs.json").write_text(
        json.dumps({"images": [{"id": i} for i in ids], "annotations": references})
    )
    good = [
        {"image_id": i, "caption": f"a {shape_of(i)[0]} {shape_of(i)[1]} on a white background"} for i in ids
    ]
    # B names the wrong shape on every other image: a hallucinated object and lower scores
    bad = [{"image_id": i, "caption": f"a {shape_of(i)[0]} {shape_of(i + i % 2)[1]}"} for i in ids]
    (tmp_path / "a.json").write_text(json.dumps(good))
    (tmp_path / "b.json").write_text(json.dumps(bad))
    instances = {
        "images": [{"id": i, "width": 64, "height": 64} for i in ids],
        "categories": [{"id": k + 1, "name": name} for k, name in enumerate(SHAPES)],
        "annotations": [
            {"id": i, "image_id": i, "category_id": SHAPES.index(shape_of(i)[1]) + 1, "bbox": [8, 8, 20, 20]}
            for i in ids
        ],
    }
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    return {name: tmp_path / f"{name}.json" for name in ("refs", "a", "b", "instances")}


def test_compare_two_results_files(files: dict[str, Path], tmp_path: Path):
    out = tmp_path / "comparison.json"
    result = evaluate(
        "--compare",
        str(files["a"]),
        str(files["b"]),
        "--annotations",
        str(files["refs"]),
        "--out",
        str(out),
        "--no-java",
        "--resamples",
        "300",
        "--seed",
        "4",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    comparison = json.loads(out.read_text())
    assert comparison["images"] == 40 and comparison["resamples"] == 300 and comparison["seed"] == 4
    assert set(comparison["metrics"]) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"}
    cider = comparison["metrics"]["CIDEr-D"]
    assert set(cider) == {"a", "b", "difference", "ci_low", "ci_high", "p_value", "p_holm"}
    assert cider["difference"] == pytest.approx(cider["b"] - cider["a"])
    assert cider["ci_high"] < 0 and cider["p_value"] < 0.05  # B is worse, and the test says so
    a, b = (parse_signature(comparison["signatures"][k]) for k in ("a", "b"))
    assert a["refs"] == b["refs"] and a["n"] == "40" and a["results"] != b["results"]
    assert "CIDEr-D" in result.stdout and "signature A:" in result.stdout and "warning" not in result.stdout
    again = evaluate(
        "--compare",
        str(files["a"]),
        str(files["b"]),
        "--annotations",
        str(files["refs"]),
        "--no-java",
        "--resamples",
        "300",
        "--seed",
        "4",
    )
    assert again.stdout.splitlines()[:9] == result.stdout.splitlines()[:9]  # seeded: the same table


def test_compare_refuses_different_image_sets(files: dict[str, Path], tmp_path: Path):
    fewer = json.loads(files["b"].read_text())[:-1]
    files["b"].write_text(json.dumps(fewer))
    out = tmp_path / "comparison.json"
    result = evaluate(
        "--compare",
        str(files["a"]),
        str(files["b"]),
        "--annotations",
        str(files["refs"]),
        "--out",
        str(out),
        "--no-java",
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        str(files["a"]),
        "image_id 40",
        str(files["b"]),
    )
    assert not out.exists()


def _not_json(files, tmp_path):
    files["a"].write_text('[{"image_id": 1, "caption": "a red circle"')
    return ["--compare", files["a"], files["b"], "--annotations", files["refs"]], [
        f"{files['a']}: not valid JSON"
    ]


def _string_id(files, tmp_path):
    entries = json.loads(files["b"].read_text())
    entries[3]["image_id"] = str(entries[3]["image_id"])
    files["b"].write_text(json.dumps(entries))
    return (
        ["--compare", files["a"], files["b"], "--annotations", files["refs"]],
        [f"{files['b']}: entry 3: image_id must be an integer, got '4'"],
    )


def _scores_not_json(files, tmp_path):
    paths = [
        write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5}),
        write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6}),
    ]
    paths[1].write_text("{CIDEr-D: 0.6}")
    return ["--aggregate", *paths], [f"{paths[1]}: not valid JSON"]


def _configs_differ(files, tmp_path):
    paths = [
        write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5}),
        write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6}, captions_per_image=3),
    ]
    return ["--aggregate", *paths], [f"{paths[1]}: train.captions_per_image: 3 here but 5 in {paths[0]}"]


def _given_twice(files, tmp_path):
    paths = [
        write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5}),
        write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6}),
    ]
    return ["--aggregate", paths[0], paths[1], paths[0]], [f"{paths[0]}: given twice"]


@pytest.mark.parametrize(
    "case",
    [_not_json, _string_id, _scores_not_json, _configs_differ, _given_twice],
    ids=["not-json", "string-image-id", "scores-not-json", "configs-differ", "given-twice"],
)
def test_compare_and_aggregate_refuse_bad_input_before_any_work(files, tmp_path, monkeypatch, case):
    from captioning.evaluation import aggregate, compare

    def never(*args, **kwargs):
        raise AssertionError("scoring began before every input was checked")

    monkeypatch.setattr(compare, "score_captions", never)
    monkeypatch.setattr(aggregate, "summarise", never)
    args, needles = case(files, tmp_path)
    out = tmp_path / "out.json"
    code, stdout, stderr = evaluate_in_process(*map(str, args), "--out", str(out), "--no-java")
    assert_one_line_error(code, stderr, *needles)
    assert stdout == "" and not out.exists()


def test_compare_and_aggregate_check_out_before_reading_anything(files, tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    missing = tmp_path / "missing.json"  # never read: --out is refused first
    for tool in (
        ["--compare", missing, files["b"], "--annotations", files["refs"]],
        ["--aggregate", missing, missing],
    ):
        code, _, stderr = evaluate_in_process(*map(str, tool), "--out", str(folder))
        assert_one_line_error(code, stderr, str(folder), "--out")
    before = files["a"].read_bytes()
    code, _, stderr = evaluate_in_process(
        "--compare",
        str(files["a"]),
        str(files["b"]),
        "--annotations",
        str(files["refs"]),
        "--out",
        str(files["a"]),
        "--no-java",
    )
    assert_one_line_error(code, stderr, str(files["a"]), "--out")
    assert files["a"].read_bytes() == before


def test_results_file_with_instances_reports_chair(files: dict[str, Path], tmp_path: Path):
    result = evaluate(
        "--annotations",
        str(files["refs"]),
        "--results",
        str(files["b"]),
        "--instances",
        str(files["instances"]),
        "--no-java",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((tmp_path / "b_scores.json").read_text())  # the run folder's naming, beside b.json
    # B names one shape per caption and the wrong one on the 20 odd-numbered images
    assert scores["CHAIR-i"] == pytest.approx(0.5) and scores["CHAIR-s"] == pytest.approx(0.5)
    assert scores["CHAIR-mentions"] == 40 and scores["CHAIR-images"] == 40
    per_image = {e["image_id"]: e for e in json.loads((tmp_path / "b_scores.per_image.json").read_text())}
    assert per_image[1]["hallucinated"] == [shape_of(2)[1]] and per_image[1]["CHAIR-s"] == 1.0
    assert per_image[2]["hallucinated"] == [] and per_image[2]["CHAIR-i"] == 0.0
    assert "CHAIR-i 0.5000" in result.stdout
    assert (
        f"signature: {scores['signature']}" in result.stdout
        and parse_signature(scores["signature"])["tok"] == "python"
    )


@pytest.mark.parametrize(
    ("table", "mentions", "hallucinated"), [(None, 3, 2), ("released", 3, 2), ("extended", 1, 0)]
)
def test_chair_table_flag_chooses_the_words_and_is_signed(tmp_path: Path, table, mentions, hallucinated):
    # The released table reads desk as a dining table and goat as a sheep; the extended one neither.
    (tmp_path / "refs.json").write_text(
        json.dumps(
            {"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "a man sitting in an office"}]}
        )
    )
    (tmp_path / "results.json").write_text(
        json.dumps([{"image_id": 1, "caption": "a man at a desk with a goat"}])
    )
    names = ["person", "dining table", "sheep"]
    (tmp_path / "instances.json").write_text(
        json.dumps(
            {
                "images": [{"id": 1, "width": 64, "height": 64}],
                "categories": [{"id": k + 1, "name": name} for k, name in enumerate(names)],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [8, 8, 20, 20]}],
            }
        )
    )
    code, _, stderr = evaluate_in_process(
        "--annotations",
        str(tmp_path / "refs.json"),
        "--results",
        str(tmp_path / "results.json"),
        "--instances",
        str(tmp_path / "instances.json"),
        "--no-java",
        *(["--chair-table", table] if table else []),
    )
    assert code == 0, stderr
    scores = json.loads((tmp_path / "results_scores.json").read_text())
    assert (scores["CHAIR-mentions"], scores["CHAIR-hallucinated"]) == (mentions, hallucinated)
    assert parse_signature(scores["signature"])["chair"] == (table or "released")


def test_chair_leaves_out_images_the_instances_files_do_not_cover(files, tmp_path):
    instances = json.loads(files["instances"].read_text())
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    for path, images in ((first, range(1, 11)), (second, range(11, 21))):  # images 21..40 have no boxes
        path.write_text(
            json.dumps(
                {
                    **instances,
                    "images": [i for i in instances["images"] if i["id"] in images],
                    "annotations": [a for a in instances["annotations"] if a["image_id"] in images],
                }
            )
        )
    code, stdout, stderr = evaluate_in_process(
        "--annotations",
        str(files["refs"]),
        "--results",
        str(files["b"]),
        "--instances",
        str(first),
        str(second),
        "--no-java",
    )
    assert code == 0, stderr
    scores = json.loads((tmp_path / "b_scores.json").read_text())
    assert (
        scores["CHAIR-images"] == 20 and scores["CHAIR-mentions"] == 20 and scores["CHAIR-hallucinated"] == 10
    )
    per_image = {e["image_id"]: e for e in json.loads((tmp_path / "b_scores.per_image.json").read_text())}
    assert (
        "CHAIR-s" in per_image[20] and "CHAIR-s" not in per_image[21] and per_image[21]["CIDEr-D"] is not None
    )
    assert "CHAIR-i 0.5000" in stdout


def write_run(folder: Path, seed: int, scores: dict, **train_changes) -> Path:
    folder.mkdir(parents=True)
    config = Config()
    save_config(
        replace(config, train=replace(config.train, seed=seed, output_dir=str(folder), **train_changes)),
        folder / "config.yaml",
    )
    (folder / "test_scores.json").write_text(json.dumps(scores))
    return folder / "test_scores.json"


def test_aggregate_over_seeds(tmp_path: Path):
    signature = "refs:abc|n:8|tok:python|impl:x|ckpt:1"
    paths = [
        write_run(
            tmp_path / f"seed{seed}",
            seed,
            {
                "CIDEr-D": cider,
                "BLEU-4": bleu,
                "METEOR": None,
                "images": 8,
                "signature": signature.replace("1", str(seed)),
            },
        )
        for seed, cider, bleu in ((1, 0.5, 0.2), (2, 0.7, 0.3), (3, 0.9, 0.1))
    ]
    out = tmp_path / "aggregate.json"
    code, stdout, stderr = evaluate_in_process("--aggregate", *map(str, paths), "--out", str(out))
    assert code == 0, stderr
    aggregate = json.loads(out.read_text())
    for metric, expected in (
        ("CIDEr-D", {"mean": 0.7, "std": 0.2, "min": 0.5, "max": 0.9}),
        ("BLEU-4", {"mean": 0.2, "std": 0.1, "min": 0.1, "max": 0.3}),
    ):
        assert {k: aggregate["metrics"][metric][k] for k in expected} == pytest.approx(expected)
    assert set(aggregate["metrics"]) == {"CIDEr-D", "BLEU-4"}  # not METEOR (null), not the image count
    assert aggregate["seeds"] == [1, 2, 3]
    assert "warning" not in stdout  # the checkpoints differ: that is the system, not the evaluation


def test_aggregate_warns_when_signatures_differ(tmp_path: Path):
    paths = [
        write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5, "signature": "refs:abc|n:8|tok:ptb"}),
        write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6, "signature": "refs:abc|n:8|tok:python"}),
    ]
    code, stdout, stderr = evaluate_in_process("--aggregate", *map(str, paths))
    assert code == 0, stderr
    assert "warning:" in stdout and "tok: ptb vs python" in stdout


def test_aggregate_refuses_runs_of_different_configurations(tmp_path: Path):
    paths = [
        write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5}),
        write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6}, lr=1e-3),
    ]
    out = tmp_path / "aggregate.json"
    code, _, stderr = evaluate_in_process("--aggregate", *map(str, paths), "--out", str(out))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {paths[1]}: train.lr: 0.001 here but ")
    assert not out.exists()
    (tmp_path / "one" / "config.yaml").unlink()
    code, _, stderr = evaluate_in_process("--aggregate", *map(str, paths))
    message = f"error: {paths[0]}: no config.yaml beside it (aggregate the test_scores.json of run folders)"
    assert code == 2 and stderr.strip() == message


def coloured_instances(files: dict[str, Path], tmp_path: Path) -> Path:
    """The fixture's boxes with each object's colour annotated, as Shapes writes them."""
    instances = json.loads(files["instances"].read_text())
    for annotation in instances["annotations"]:
        annotation["color"] = shape_of(annotation["image_id"])[0]
    path = tmp_path / "coloured.json"
    path.write_text(json.dumps(instances))
    return path


def test_attribute_hallucination_with_annotated_colours(files: dict[str, Path], tmp_path: Path):
    # C names the right shape everywhere and the wrong colour on the 20 even-numbered images: CHAIR sees
    # nothing, attribute hallucination sees every one of them.
    wrong_colour = [
        {"image_id": i, "caption": f"a {shape_of(i + 1 - i % 2)[0]} {shape_of(i)[1]} on a white background"}
        for i in range(1, 41)
    ]
    (tmp_path / "c.json").write_text(json.dumps(wrong_colour))
    instances = coloured_instances(files, tmp_path)
    code, stdout, stderr = evaluate_in_process(
        "--annotations",
        str(files["refs"]),
        "--results",
        str(tmp_path / "c.json"),
        "--instances",
        str(instances),
        "--no-java",
    )
    assert code == 0, stderr
    scores = json.loads((tmp_path / "c_scores.json").read_text())
    assert scores["CHAIR-hallucinated"] == 0
    assert scores["attribute-precision"] == pytest.approx(0.5) and scores[
        "attribute-recall"
    ] == pytest.approx(0.5)
    assert scores["attribute-wrong"] == pytest.approx(0.5) and scores["attribute-images"] == 40
    per_image = {e["image_id"]: e for e in json.loads((tmp_path / "c_scores.per_image.json").read_text())}
    assert per_image[2]["wrong-phrases"] == [f"{shape_of(3)[0]} {shape_of(2)[1]}"]
    assert per_image[1]["wrong-phrases"] == []
    assert "attribute hallucination: precision 0.5000 (20 of 40 phrases right)" in stdout

    # --compare tests the attribute numbers like the other ratios, from the per-image scores files.
    out = tmp_path / "comparison.json"
    code, stdout, stderr = evaluate_in_process(
        "--compare",
        str(files["a"]),
        str(tmp_path / "c.json"),
        "--annotations",
        str(files["refs"]),
        "--instances",
        str(instances),
        "--out",
        str(out),
        "--no-java",
        "--resamples",
        "300",
    )
    assert code == 0, stderr
    metrics = json.loads(out.read_text())["metrics"]
    precision, wrong = metrics["attribute-precision"], metrics["attribute-wrong"]
    assert precision["a"] == 1.0 and precision["b"] == pytest.approx(0.5) and precision["ci_high"] < 0
    assert wrong["difference"] == pytest.approx(0.5) and wrong["p_value"] < 0.05
    assert "attribute-precision" in stdout
