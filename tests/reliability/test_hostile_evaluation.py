"""The inputs of evaluate.py's scoring, --compare and --aggregate are checked as the training inputs
are: instances files, scores files and their run folders; and the signature records the instances.

evaluate.py runs in this process (tests/tool_runs.py), on test_evaluation_tools' files.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from test_evaluation_tools import files, write_run
from test_faults import assert_one_line_error
from tool_runs import in_process

from captioning.evaluation.signature import parse_signature

__all__ = ["files"]  # a fixture of test_evaluation_tools


def evaluate(*args, cwd):
    return in_process("evaluate.py", "--no-java", *args, cwd=cwd, timeout=120)


# ------------------------------------------------------------------ instances files


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda categories: categories[1].update(name=""),
            "categories[1]: name must be a non-empty string, got ''",
        ),
        (
            lambda categories: categories[1].update(name=None),
            "categories[1]: name must be a non-empty string, got None",
        ),
        (
            lambda categories: categories[2].update(name=7),
            "categories[2]: name must be a non-empty string, got 7",
        ),
        (
            lambda categories: categories[3].update(id=1),
            "categories[3]: id 1 is also the id of categories[0]",
        ),
    ],
    ids=["empty-name", "null-name", "integer-name", "duplicate-id"],
)
def test_odd_categories_are_refused_naming_the_file_and_the_entry(files, tmp_path, edit, needle):
    instances = json.loads(files["instances"].read_text())
    edit(instances["categories"])
    odd = tmp_path / "odd_instances.json"
    odd.write_text(json.dumps(instances))
    result = evaluate(
        "--annotations",
        files["refs"],
        "--results",
        files["a"],
        "--instances",
        odd,
        "--out",
        tmp_path / "s.json",
        cwd=tmp_path,
    )
    assert_one_line_error(result.returncode, result.stderr, f"{odd}: {needle}")
    assert not (tmp_path / "s.json").exists()


def test_the_signature_records_the_instances_and_changes_with_them(files, tmp_path):
    def signature(instances, name):
        out = tmp_path / f"{name}.json"
        result = evaluate(
            "--annotations",
            files["refs"],
            "--results",
            files["a"],
            "--instances",
            instances,
            "--out",
            out,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        return json.loads(out.read_text())["signature"]

    instances = json.loads(files["instances"].read_text())
    reordered = tmp_path / "reordered.json"  # the same boxes, listed in another order
    reordered.write_text(json.dumps({**instances, "annotations": instances["annotations"][::-1]}, indent=1))
    moved = tmp_path / "moved.json"
    instances["annotations"][0]["bbox"] = [30, 30, 20, 20]
    moved.write_text(json.dumps(instances))
    first, same, other = (
        signature(files["instances"], "first"),
        signature(reordered, "same"),
        signature(moved, "other"),
    )
    assert parse_signature(first)["inst"] and parse_signature(first)["words"]
    assert first == same
    assert parse_signature(other)["inst"] != parse_signature(first)["inst"]
    without = evaluate(
        "--annotations",
        files["refs"],
        "--results",
        files["a"],
        "--out",
        tmp_path / "plain.json",
        cwd=tmp_path,
    )
    assert without.returncode == 0, without.stderr
    assert "inst" not in parse_signature(json.loads((tmp_path / "plain.json").read_text())["signature"])
    # two runs scored with different instances files: --aggregate says their numbers are not comparable
    runs = [
        write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": 0.5 + seed / 10, "signature": text})
        for seed, text in ((1, first), (2, other))
    ]
    result = evaluate("--aggregate", *runs, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "not computed the same way (inst:" in result.stdout


# ------------------------------------------------------------------ --aggregate


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("missing", "CIDEr-D: missing"),
        (None, "CIDEr-D: None is not a number"),
        (float("nan"), "CIDEr-D: nan is not a finite score"),
        (float("inf"), "CIDEr-D: inf is not a finite score"),
        ("0.7", "CIDEr-D: '0.7' is not a number"),
        (1e308, "CIDEr-D: 1e+308 is not a finite score"),
    ],
    ids=["missing", "null", "nan", "infinite", "string", "huge"],
)
def test_a_metric_that_is_not_a_score_in_one_run_is_named(tmp_path, value, needle):
    second = {"BLEU-4": 0.3} if value == "missing" else {"BLEU-4": 0.3, "CIDEr-D": value}
    runs = [
        write_run(tmp_path / "seed1", 1, {"CIDEr-D": 0.5, "BLEU-4": 0.2}),
        write_run(tmp_path / "seed2", 2, second),
    ]
    result = evaluate("--aggregate", *runs, cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, f"{runs[1]}: {needle}", f"a number in {runs[0]}")


def test_the_same_scores_file_by_another_name_is_refused(tmp_path):
    runs = [write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": 0.5}) for seed in (1, 2)]
    (tmp_path / "linked").symlink_to(tmp_path / "seed1", target_is_directory=True)
    for again in (
        tmp_path / "seed2" / ".." / "seed1" / "test_scores.json",
        tmp_path / "linked" / "test_scores.json",
        os.path.relpath(runs[0], tmp_path),
    ):
        result = evaluate("--aggregate", *runs, again, cwd=tmp_path)
        assert_one_line_error(result.returncode, result.stderr, f"{again}: given twice (also as {runs[0]})")


def test_odd_scores_files_and_run_folders_are_named(tmp_path, files):
    runs = [write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": 0.5}) for seed in (1, 2)]
    for text, needle in (
        ("", "empty file"),
        (json.dumps({"CIDEr-D": 0.6, "signature": 12}), "signature must be a string, got int"),
    ):
        runs[1].write_text(text)
        result = evaluate("--aggregate", *runs, cwd=tmp_path)
        assert_one_line_error(result.returncode, result.stderr, f"{runs[1]}: {needle}")
    runs[1].write_text(json.dumps({"CIDEr-D": 0.6}))
    config = runs[1].parent / "config.yaml"
    config.unlink()
    os.mkfifo(config)
    result = evaluate("--aggregate", *runs, cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, f"{config}: not a regular file (a FIFO)")
    assert stat.S_ISFIFO(os.stat(config).st_mode)
    result = evaluate("--aggregate", *runs, "--annotations", files["refs"], cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "--annotations: not used by --aggregate")


def test_compare_of_a_file_with_itself_says_so(files, tmp_path):
    (tmp_path / "same.json").symlink_to(files["a"])
    for other in (files["a"], tmp_path / "same.json"):
        result = evaluate("--compare", files["a"], other, "--annotations", files["refs"], cwd=tmp_path)
        assert_one_line_error(
            result.returncode, result.stderr, f"--compare: {files['a']} and {other} are the same file"
        )
