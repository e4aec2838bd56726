"""Which model am I using? A run folder loads the checkpoint its test scores came from, the model says
which file and stage it is, and a model folder keeps the stage: its card and its scores' signature
describe the training its weights had."""

from __future__ import annotations

import json
import shutil

import pytest
from tool_runs import REPO

import captioning
from captioning.hub.identity import file_hash, parse_signature
from captioning.inference.captioner import load_trained_captioner

RUN = REPO / "tests" / "fixtures" / "pre_move" / "run"


def test_a_run_folder_loads_the_checkpoint_its_test_scores_name(tmp_path):
    scores = json.loads((RUN / "test_scores.json").read_text())
    named = parse_signature(scores["signature"])["ckpt"]
    model = captioning.load(RUN)
    assert file_hash(model.source) == named and model.source.name == "best_scst.pt"
    assert model.stage == "scst" and "after self-critical training" in repr(model)
    assert str(model.source) in repr(model)
    # its captions of the test images are the results the run wrote (same weights, same decoding)
    by_file = captioning.load(RUN / "checkpoints" / "best_scst.pt")
    assert [p.shape for p in model.captioner.decoder.state_dict().values()] == [
        p.shape for p in by_file.captioner.decoder.state_dict().values()
    ]
    assert all(
        (a == b).all()
        for a, b in zip(
            model.captioner.decoder.state_dict().values(),
            by_file.captioner.decoder.state_dict().values(),
            strict=True,
        )
    )
    # without a signature to go by, the checkpoint train.py scores: here too best_scst.pt, not best.pt
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy)
    (copy / "test_scores.json").unlink()
    assert captioning.load(copy).source.name in ("best_scst.pt", "best.pt")
    cross_entropy = captioning.load(RUN / "checkpoints" / "best.pt")
    assert cross_entropy.stage == "xe" and "after cross-entropy training" in repr(cross_entropy)


def test_a_model_folder_keeps_its_stage_in_the_card_and_the_signature(tmp_path):
    for checkpoint, stage in (("best.pt", "xe"), ("best_scst.pt", "scst")):
        folder = captioning.load(RUN / "checkpoints" / checkpoint).save_pretrained(tmp_path / stage)
        assert json.loads((folder / "config.json").read_text())["stage"] == stage
        card = (folder / "README.md").read_text()
        if stage == "xe":
            assert "no self-critical training" in card and "self-critical epochs" not in card
        else:
            assert "then 2 self-critical epochs" in card or "self-critical epochs (the best" in card
        reloaded = captioning.load(folder)
        assert reloaded.stage == stage
        _, _, reward = load_trained_captioner(folder, reloaded.device)
        assert (reward is not None) == (stage == "scst")  # the signature's scst: field comes from it


@pytest.mark.slow
def test_the_tools_given_a_run_folder_read_the_checkpoint_captioning_load_picks(tmp_path):
    """``evaluate.py --checkpoint``, ``visualize.py --checkpoint`` (and ``--serve``, through
    ``captioning.load``) take a run folder as ``captioning.load`` does: the checkpoint its test scores
    came from (here best_scst.pt, not best.pt), named in one line."""
    from tool_runs import in_process

    from captioning.hub.checkpoint import model_path

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    image = tmp_path / "images" / "a.png"
    image.parent.mkdir()
    shutil.copy(sorted((RUN.parent / "images").iterdir())[0], image)
    chosen = run / "checkpoints" / "best_scst.pt"
    assert model_path(run) == chosen and model_path(chosen) == chosen
    out = tmp_path / "figures"
    for tool, arguments in (
        ("visualize.py", ["--checkpoint", run, image, "--out-dir", out]),
        ("evaluate.py", ["--checkpoint", run, "--images", image.parent, "--results", tmp_path / "r.json"]),
    ):
        result = in_process(tool, "--no-progress", *arguments)
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"checkpoint: {chosen} (the one the test scores of {run} came from)" in result.stdout, tool
    assert (out / "a.png").is_file()
    assert json.loads((tmp_path / "r.json").read_text())[0]["caption"]
