"""The command-line tools end to end: a shortened demo, then evaluate.py's three uses and visualize.py.

Each tool runs once as a user starts it, in a subprocess (the demo, evaluate.py on a split, visualize.py);
the other uses of evaluate.py run it in this process (tests/tool_runs.py), as a subprocess would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from tool_runs import in_process

from captioning.config.loading import load_config
from captioning.evaluation.scorers import reported_metrics
from captioning.evaluation.signature import decode_description, file_hash, parse_signature
from captioning.hub.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
# Every test here uses the shortened demo run (the module fixture): the whole file is in the slow tier.
pytestmark = pytest.mark.slow

SHORT_DEMO = {
    "data.shapes_train": 48,
    "data.shapes_val": 8,
    "data.shapes_test": 8,
    "data.shapes_image_size": 96,
    "model.encoder.image_size": 96,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "train.epochs": 1,
    "train.batch_size": 8,
    "train.scst_epochs": 1,
    "train.scst_samples": 2,
    "decode.batch_size": 4,
    "decode.max_length": 10,
    "train.warmup_steps": 1,  # the demo's cosine schedule, warming up over 1 of these 6 steps
}


def run(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """``python train.py`` (the Shapes demo) shortened: few images, one epoch of each stage."""
    work = tmp_path_factory.mktemp("demo")
    flags = [
        arg
        for key, value in {
            **SHORT_DEMO,
            "data.root": work / "shapes",
            "train.output_dir": work / "run",
        }.items()
        for arg in ("--set", f"{key}={value}")
    ]
    result = run("train.py", "--no-progress", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    (work / "stdout.txt").write_text(result.stdout)
    return work


def test_demo_writes_every_promised_file(demo):
    run_dir = demo / "run"
    stdout = (demo / "stdout.txt").read_text()
    promised = [
        "checkpoints/best.pt",
        "checkpoints/best_scst.pt",
        "checkpoints/last.pt",
        "config.yaml",
        "vocab.json",
        "steps.jsonl",
        "history.json",
        "test_results.json",
        "test_scores.json",
        "test_scores.per_image.json",
        "report.html",
    ]
    for name in promised:
        assert (run_dir / name).is_file(), name
        assert str(run_dir / name) in stdout or name.startswith("checkpoints/best_scst"), (
            f"{name} not in summary"
        )
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    history = json.loads((run_dir / "history.json").read_text())["epochs"]
    assert [h["stage"] for h in history] == ["xe", "scst"]
    payload = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert payload["training"]["state"]["stage"] == "scst"

    results = json.loads((run_dir / "test_results.json").read_text())
    assert len(results) == 8
    assert all(isinstance(r["image_id"], int) and isinstance(r["caption"], str) for r in results)
    scores = json.loads((run_dir / "test_scores.json").read_text())
    for key in reported_metrics():
        assert key in scores
    for key in ("BLEU-1", "BLEU-4", "ROUGE-L", "CIDEr-D"):
        assert scores[key] is not None and scores[key] >= 0
    assert scores["SPICE"] is None and "SPICE" in scores["unavailable"]
    # Grounding is reported for Shapes by default; a model this briefly trained may name no object yet.
    if scores["grounding-words"]:
        assert 0 <= scores["grounding-pointing"] <= 1 and 0 <= scores["grounding-mass"] <= 1
    else:
        assert scores["grounding-pointing"] is None and scores["grounding-mass"] is None
    per_image = json.loads((run_dir / "test_scores.per_image.json").read_text())
    assert {p["image_id"] for p in per_image} == {r["image_id"] for r in results}

    figures = sorted((run_dir / "figures").glob("*.png"))
    assert figures
    with Image.open(figures[0]) as figure:
        assert figure.size[0] > 100 and figure.size[1] > 100
    report = (run_dir / "report.html").read_text()
    assert report.count("data:image/") >= 2 and "http://" not in report


def test_demo_scores_carry_chair_and_signature(demo):
    run_dir = demo / "run"
    scores = json.loads((run_dir / "test_scores.json").read_text())
    per_image = json.loads((run_dir / "test_scores.per_image.json").read_text())
    assert len(per_image) == 8 and all({"CHAIR-i", "CHAIR-s", "hallucinated"} <= set(p) for p in per_image)
    assert scores["CHAIR-hallucinated"] == sum(len(p["hallucinated"]) for p in per_image)
    assert scores["CHAIR-s"] == pytest.approx(sum(p["CHAIR-s"] for p in per_image) / 8)
    if scores["CHAIR-mentions"]:
        assert scores["CHAIR-i"] == pytest.approx(scores["CHAIR-hallucinated"] / scores["CHAIR-mentions"])
    signature = parse_signature(scores["signature"])
    assert signature["ckpt"] == file_hash(scores["checkpoint"]) and signature["n"] == "8"
    assert signature["decode"] == decode_description(load_config(run_dir / "config.yaml").decode)
    assert signature["chair"] == "released"
    # The self-critical reward is named exactly when the scored weights went through that stage.
    tuned = Path(scores["checkpoint"]).name == "best_scst.pt"
    assert signature.get("scst") == ("cider-d.eos" if tuned else None)
    stdout = (demo / "stdout.txt").read_text()
    assert "object hallucination: CHAIR-i" in stdout and f"signature: {scores['signature']}" in stdout
    # Shapes annotates colour and size: every phrase is judged, and the report lists the wrong ones.
    assert scores["attribute-images"] == 8 and "attribute hallucination: precision" in stdout
    assert scores["attribute-wrong-captions"] == sum(p["attribute-wrong-caption"] for p in per_image)
    assert scores["attribute-phrases"] == sum(p["attribute-phrases"] for p in per_image)
    report = (run_dir / "report.html").read_text()
    assert "<th>wrong phrases</th>" in report
    for phrase in {phrase for p in per_image for phrase in p["wrong-phrases"]}:
        assert f"<td>{phrase}" in report or f", {phrase}" in report


def test_evaluate_decodes_a_split_and_scores_it(demo, tmp_path):
    checkpoint = demo / "run" / "checkpoints" / "best.pt"
    out = tmp_path / "val_results.json"
    result = run(
        "evaluate.py",
        "--checkpoint",
        str(checkpoint),
        "--split",
        "val",
        "--results",
        str(out),
        "--no-progress",
        "--no-java",
        "--spice",
        "--pointing-tolerance",
        "20",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(out.read_text())
    assert len(results) == 8
    scores = json.loads((tmp_path / "val_scores.json").read_text())
    assert scores["METEOR"] is None and "Java" in scores["unavailable"]["METEOR"]
    # asked for, so not "not requested"
    assert scores["SPICE"] is None and "Java" in scores["unavailable"]["SPICE"]
    assert scores["CIDEr-D"] is not None
    assert "grounding-mass" in scores
    assert "CIDEr-D" in result.stdout and str(out) in result.stdout
    assert 0 <= scores["CHAIR-s"] <= 1  # Shapes' instances are found without --instances, as for grounding
    signature = parse_signature(scores["signature"])
    assert (
        signature["ckpt"] == file_hash(checkpoint) and signature["n"] == "8" and signature["tok"] == "python"
    )
    # both pointing games, the published one with the tolerance asked for (in the signature)
    assert signature["point"] == "20px"
    assert {
        "grounding-pointing",
        "grounding-pointing-published",
        "grounding-pointing-published-classes",
        "grounding-pointing-published-mentioned-classes",
    } <= set(scores)
    if scores["grounding-words"]:
        assert "pointing game (strict" in result.stdout and "pointing game (published" in result.stdout
        assert "within 20px of the object" in result.stdout


def test_evaluate_set_changes_decoding_but_never_the_model(demo, tmp_path):
    checkpoint = str(demo / "run" / "checkpoints" / "best.pt")
    common = [
        "--checkpoint",
        checkpoint,
        "--split",
        "val",
        "--no-progress",
        "--no-java",
        "--strategy",
        "greedy",
    ]
    lengths = {}
    for name, extra in (("default", []), ("short", ["--set", "decode.max_length=2"])):
        out = tmp_path / f"{name}.json"
        result = in_process("evaluate.py", *common, "--results", str(out), *extra)
        assert result.returncode == 0, result.stderr[-2000:]
        lengths[name] = [len(c["caption"].split()) for c in json.loads(out.read_text())]
    assert max(lengths["default"]) > 2  # so that the limit below is the override's doing
    assert max(lengths["short"]) <= 2
    refused = in_process(
        "evaluate.py", *common, "--results", str(tmp_path / "x.json"), "--set", "model.decoder.hidden_dim=8"
    )
    assert refused.returncode == 2
    message = (
        "error: model.decoder.hidden_dim: only data.* and decode.* keys can be overridden here "
        "(the rest is fixed, e.g. by the checkpoint)"
    )
    assert refused.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "x.json").exists()


def test_evaluate_scores_a_results_file_against_coco_references(demo, tmp_path):
    references = demo / "shapes" / "captions_test.json"
    results = tmp_path / "results.json"
    coco = json.loads(references.read_text())
    first = {}
    for annotation in coco["annotations"]:
        first.setdefault(annotation["image_id"], annotation["caption"])
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in first.items()]))
    out = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py",
        "--annotations",
        str(references),
        "--results",
        str(results),
        "--out",
        str(out),
        "--no-java",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads(out.read_text())
    assert scores["BLEU-1"] == pytest.approx(1.0)  # each candidate is one of its own references
    assert scores["CIDEr-D"] > 1.0


def test_evaluate_captions_a_folder_of_images(demo, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (120, 80), (200, 30, 30)).save(folder / "red.jpg")
    Image.new("L", (64, 64), 128).save(folder / "gray.png")
    out = tmp_path / "captions.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        str(demo / "run" / "checkpoints" / "best.pt"),
        "--images",
        str(folder),
        "--results",
        str(out),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    captions = json.loads(out.read_text())
    assert [c["image_id"] for c in captions] == [1, 2]
    assert all(c["caption"] for c in captions)
    index = json.loads((tmp_path / "captions_files.json").read_text())
    assert index["1"].endswith("gray.png") and index["2"].endswith("red.jpg")


def test_visualize_a_dataset_split_with_references(demo, tmp_path):
    result = run(
        "visualize.py",
        "--checkpoint",
        str(demo / "run" / "checkpoints" / "best.pt"),
        "--split",
        "test",
        "--num",
        "3",
        "--out-dir",
        str(tmp_path / "figs"),
        "--html",
        str(tmp_path / "page.html"),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(list((tmp_path / "figs").glob("*.png"))) == 3
    assert (tmp_path / "page.html").is_file()
