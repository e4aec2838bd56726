"""The explain settings are declared once (``ExplainConfig``): a field added to it, here for real with
``dataclasses.make_dataclass``, reaches ``evaluate.py``'s ``--help`` and flags, the scores' signature and
``model.explain`` with no other edit; every field but the speed-only ones changes the signature."""

from __future__ import annotations

import argparse
import json
from dataclasses import field, fields, make_dataclass, replace
from pathlib import Path

import pytest
from tiny_models import tiny_checkpoint
from tool_runs import REPO, in_process

import captioning
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.explain import config as explain_config
from captioning.explain.config import ExplainConfig, add_explain_flags, config_from_flags, signature_part

pytestmark = pytest.mark.usefixtures("single_thread")


def with_new_field() -> type[ExplainConfig]:
    """ExplainConfig with one more option, as a contributor adding SmoothGrad's sample count would."""
    return make_dataclass(
        "SmoothedExplainConfig",
        [("noise_samples", int, field(default=0, metadata={"flag": True, "help": "SmoothGrad's samples"}))],
        bases=(ExplainConfig,),
        frozen=True,
    )


def test_every_field_that_changes_the_numbers_is_in_the_signature():
    base = ExplainConfig()
    changed = {
        "methods": ("attention",),
        "ig_steps": 17,
        "curve_steps": 9,
        "random_seeds": 4,
        "sanity_images": 3,
        "sanity_threshold": 0.25,
        "score": "logit",
        "baseline": "zeros",
        "order_seed": 5,
        "pointing_tolerance": 9.0,
        "sanity_randomisation": "cascading",
        "similarity_size": 64,
        "pixel_steps": 3,
        "pixel_deletion_value": 0.5,
    }
    speed_only = {"batch_images", "batch_rows"}
    assert set(changed) | speed_only == {item.name for item in fields(ExplainConfig)}  # every field listed
    signature = signature_part(base, 4)
    for name, value in changed.items():
        assert signature_part(replace(base, **{name: value}), 4) != signature, name
    for name in speed_only:
        assert signature_part(replace(base, **{name: 1}), 4) == signature, name
    assert "|" not in signature and ":" not in signature


def test_a_new_field_reaches_the_flags_and_the_signature():
    Smoothed = with_new_field()
    parser = argparse.ArgumentParser()
    add_explain_flags(parser, Smoothed)
    assert "--noise-samples" in parser.format_help() and "SmoothGrad's samples" in parser.format_help()
    args = parser.parse_args(["--noise-samples", "4", "--ig-steps", "8"])
    config = config_from_flags(args, Smoothed, methods=("attention",))
    assert type(config) is Smoothed and config.noise_samples == 4 and config.ig_steps == 8
    assert ",noise_samples=4" in signature_part(config, 2)
    assert "noise_samples" not in signature_part(Smoothed(), 2)  # at its default, as a decoding option
    with pytest.raises(captioning.utils.errors.InputError, match="noise_samples"):
        Smoothed(noise_samples=2.5)  # its type is checked as every field's


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary):
    folder = tmp_path_factory.mktemp("run_config")
    return tiny_checkpoint(folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, "lstm")


def test_a_new_field_reaches_evaluate_and_the_api(
    checkpoint: Path, tmp_path: Path, tiny_shapes: ShapesFiles, monkeypatch: pytest.MonkeyPatch
):
    Smoothed = with_new_field()
    monkeypatch.setattr(explain_config, "ExplainConfig", Smoothed)  # the class evaluate.py reads
    shown = in_process("evaluate.py", "--help", cwd=REPO)
    assert "--noise-samples" in shown.stdout
    scores = tmp_path / "scores.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", tmp_path / "results.json", "--out", scores, "--faithfulness", "attention",
        "--curve-steps", "2", "--random-seeds", "1", "--sanity-images", "0", "--faithfulness-figures", "0",
        "--noise-samples", "4", "--baseline", "zeros",
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = json.loads(scores.read_text())
    faith = written["signature"].split("|faith:")[1]
    assert "noise_samples=4" in faith and "baseline=zeros" in faith
    assert written["faithfulness"]["settings"]["noise_samples"] == 4
    # the API takes the new field by name, with a settings object of the class
    model = captioning.load(checkpoint, device="cpu")
    images = sorted((tiny_shapes.root / "test").glob("*.png"))[:1]
    explained = model.explain(images, ["attention"], settings=Smoothed(), noise_samples=3, baseline="zeros")
    assert len(explained) == 1
