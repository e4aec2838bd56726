"""evaluate.py's --compare, --aggregate and CHAIR with --instances, through the command line.

--compare and CHAIR run ``python evaluate.py`` in a subprocess; --aggregate (which decodes and
scores nothing) goes through the same ``run_cli(main, get_args_parser(), argv)`` call in this
process, to keep the module fast.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from captioning.cli import run_cli
from captioning.config import Config, save_config
from captioning.evaluation.signature import parse_signature

REPO = Path(__file__).resolve().parent.parent
COLOURS = ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle", "diamond")


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "evaluate.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, check=False)


def evaluate_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """``python evaluate.py args`` in this process: (exit status, stdout, stderr)."""
    spec = importlib.util.spec_from_file_location("evaluate_script", REPO / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    code = run_cli(module.main, module.get_args_parser(), list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def shape_of(image_id: int) -> tuple[str, str]:
    return COLOURS[image_id % 5], SHAPES[image_id % 4]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """40 Shapes-like images with references and boxes, a good system A and a worse system B."""
    ids = list(range(1, 41))
    references = [{"image_id": i, "caption": text}
                  for i in ids for text in (f"a {shape_of(i)[0]} {shape_of(i)[1]} on a white background",
                                            f"there is a {shape_of(i)[0]} {shape_of(i)[1]}")]
    (tmp_path / "refs.json").write_text(json.dumps({"images": [{"id": i} for i in ids], "annotations": references}))
    good = [{"image_id": i, "caption": f"a {shape_of(i)[0]} {shape_of(i)[1]} on a white background"} for i in ids]
    # B names the wrong shape on every other image: a hallucinated object and lower scores
    bad = [{"image_id": i, "caption": f"a {shape_of(i)[0]} {shape_of(i + i % 2)[1]}"} for i in ids]
    (tmp_path / "a.json").write_text(json.dumps(good))
    (tmp_path / "b.json").write_text(json.dumps(bad))
    instances = {"images": [{"id": i, "width": 64, "height": 64} for i in ids],
                 "categories": [{"id": k + 1, "name": name} for k, name in enumerate(SHAPES)],
                 "annotations": [{"id": i, "image_id": i, "category_id": SHAPES.index(shape_of(i)[1]) + 1,
                                  "bbox": [8, 8, 20, 20]} for i in ids]}
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    return {name: tmp_path / f"{name}.json" for name in ("refs", "a", "b", "instances")}


def test_compare_two_results_files(files: dict[str, Path], tmp_path: Path):
    out = tmp_path / "comparison.json"
    result = evaluate("--compare", str(files["a"]), str(files["b"]), "--annotations", str(files["refs"]),
                      "--out", str(out), "--no-java", "--resamples", "300", "--seed", "4")
    assert result.returncode == 0, result.stderr[-2000:]
    comparison = json.loads(out.read_text())
    assert comparison["images"] == 40 and comparison["resamples"] == 300 and comparison["seed"] == 4
    assert set(comparison["metrics"]) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr-D"}
    cider = comparison["metrics"]["CIDEr-D"]
    assert set(cider) == {"a", "b", "difference", "ci_low", "ci_high", "p_value"}
    assert cider["difference"] == pytest.approx(cider["b"] - cider["a"])
    assert cider["ci_high"] < 0 and cider["p_value"] < 0.05  # B is worse, and the test says so
    a, b = (parse_signature(comparison["signatures"][k]) for k in ("a", "b"))
    assert a["refs"] == b["refs"] and a["n"] == "40" and a["results"] != b["results"]
    assert "CIDEr-D" in result.stdout and "signature A:" in result.stdout and "warning" not in result.stdout
    again = evaluate("--compare", str(files["a"]), str(files["b"]), "--annotations", str(files["refs"]),
                     "--no-java", "--resamples", "300", "--seed", "4")
    assert again.stdout.splitlines()[:9] == result.stdout.splitlines()[:9]  # seeded: the same table


def test_compare_refuses_different_image_sets(files: dict[str, Path], tmp_path: Path):
    fewer = json.loads(files["b"].read_text())[:-1]
    files["b"].write_text(json.dumps(fewer))
    out = tmp_path / "comparison.json"
    result = evaluate("--compare", str(files["a"]), str(files["b"]), "--annotations", str(files["refs"]),
                      "--out", str(out), "--no-java")
    assert result.returncode == 2
    message = (f"error: {files['a']}: image_id 40 is not in {files['b']}: a paired comparison needs both "
               "systems' captions of the same images")
    assert result.stderr.strip().splitlines() == [message]
    assert not out.exists()


def test_results_file_with_instances_reports_chair(files: dict[str, Path], tmp_path: Path):
    out = tmp_path / "b.scores.json"
    result = evaluate("--annotations", str(files["refs"]), "--results", str(files["b"]),
                      "--instances", str(files["instances"]), "--out", str(out), "--no-java")
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    # B names one shape per caption and the wrong one on the 20 odd-numbered images
    assert scores["CHAIR-i"] == pytest.approx(0.5) and scores["CHAIR-s"] == pytest.approx(0.5)
    assert scores["CHAIR-mentions"] == 40
    per_image = {e["image_id"]: e for e in json.loads((tmp_path / "b.scores.per_image.json").read_text())}
    assert per_image[1]["hallucinated"] == [shape_of(2)[1]] and per_image[1]["CHAIR-s"] == 1.0
    assert per_image[2]["hallucinated"] == [] and per_image[2]["CHAIR-i"] == 0.0
    assert "CHAIR-i 0.5000" in result.stdout
    assert f"signature: {scores['signature']}" in result.stdout and parse_signature(scores["signature"])["tok"] == "python"


def write_run(folder: Path, seed: int, scores: dict, **train_changes) -> Path:
    folder.mkdir(parents=True)
    config = Config()
    save_config(replace(config, train=replace(config.train, seed=seed, output_dir=str(folder), **train_changes)),
                folder / "config.yaml")
    (folder / "test_scores.json").write_text(json.dumps(scores))
    return folder / "test_scores.json"


def test_aggregate_over_seeds(tmp_path: Path, capsys):
    signature = "refs:abc|n:8|tok:python|impl:x|ckpt:1"
    paths = [write_run(tmp_path / f"seed{seed}", seed, {"CIDEr-D": cider, "BLEU-4": bleu, "METEOR": None,
                                                        "images": 8, "signature": signature.replace("1", str(seed))})
             for seed, cider, bleu in ((1, 0.5, 0.2), (2, 0.7, 0.3), (3, 0.9, 0.1))]
    out = tmp_path / "aggregate.json"
    code, stdout, stderr = evaluate_in_process(capsys, "--aggregate", *map(str, paths), "--out", str(out))
    assert code == 0, stderr
    aggregate = json.loads(out.read_text())
    assert aggregate["metrics"]["CIDEr-D"] == pytest.approx({"mean": 0.7, "std": 0.2, "min": 0.5, "max": 0.9})
    assert aggregate["metrics"]["BLEU-4"] == pytest.approx({"mean": 0.2, "std": 0.1, "min": 0.1, "max": 0.3})
    assert set(aggregate["metrics"]) == {"CIDEr-D", "BLEU-4"}  # not METEOR (null), not the image count
    assert aggregate["seeds"] == [1, 2, 3]
    assert "warning" not in stdout  # the checkpoints differ: that is the system, not the evaluation


def test_aggregate_warns_when_signatures_differ(tmp_path: Path, capsys):
    paths = [write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5, "signature": "refs:abc|n:8|tok:ptb"}),
             write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6, "signature": "refs:abc|n:8|tok:python"})]
    code, stdout, stderr = evaluate_in_process(capsys, "--aggregate", *map(str, paths))
    assert code == 0, stderr
    assert "warning:" in stdout and "tok: ptb vs python" in stdout


def test_aggregate_refuses_runs_of_different_configurations(tmp_path: Path, capsys):
    paths = [write_run(tmp_path / "one", 1, {"CIDEr-D": 0.5}),
             write_run(tmp_path / "two", 2, {"CIDEr-D": 0.6}, lr=1e-3)]
    out = tmp_path / "aggregate.json"
    code, _, stderr = evaluate_in_process(capsys, "--aggregate", *map(str, paths), "--out", str(out))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {paths[1]}: train.lr: 0.001 here but ")
    assert not out.exists()
    (tmp_path / "one" / "config.yaml").unlink()
    code, _, stderr = evaluate_in_process(capsys, "--aggregate", *map(str, paths))
    message = f"error: {paths[0]}: no config.yaml beside it (aggregate the test_scores.json of run folders)"
    assert code == 2 and stderr.strip() == message
