"""Decoding options are checked in the type they are used in, and decoding, self-critical rollouts and
the decoder's parameters are bounded by what they cost, before any work, through every door: the
Python API, evaluate.py's flags and ``--set``, a model folder's and an ONNX export's config.json, and
train.py (which checks what its validation and rollouts will need before its first step)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from messages import raises_naming
from PIL import Image
from test_faults import assert_one_line_error, shapes
from test_hostile import short_run
from tool_runs import REPO, in_process, run_tool

import captioning
from captioning.config import ConfigError
from captioning.hub.checkpoint import CheckpointError
from captioning.models import memory_bounds

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes"]  # a fixture of another test module

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"
# 1e-300 is a positive Python float and 0 as the 32-bit float the nucleus compares with: every word
# would be dropped and sampling would draw from NaN.
TINY = "1e-300"


def never(*args, **kwargs):
    raise AssertionError("work started before the value was checked")


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(folder / "red.png")
    return folder


def edited(folder, change) -> None:
    """``folder``'s config.json with ``change(description)`` applied."""
    path = folder / "config.json"
    description = json.loads(path.read_text(encoding="utf-8"))
    change(description)
    path.write_text(json.dumps(description), encoding="utf-8")


def test_a_top_p_that_is_zero_in_32_bits_is_refused_through_the_api_and_model_folders(tmp_path):
    model = captioning.load(FIXTURE)
    picture = np.zeros((16, 16, 3), dtype=np.uint8)
    with raises_naming(ConfigError, "decode.top_p", TINY, "32-bit"):
        model.caption([picture], strategy="sample", top_p=float(TINY))
    with raises_naming(ConfigError, "decode.temperature", "1e+300"):
        model.caption([picture], strategy="sample", temperature=1e300)
    # the smallest top_p a 32-bit float holds keeps the most likely word: sampling is then greedy
    (sampled,) = model.caption([picture], strategy="sample", top_p=1.2e-38)
    (greedy,) = model.caption([picture], strategy="greedy")
    assert sampled.words == greedy.words and np.isfinite(sampled.log_prob)
    for folder, runtime in (
        (model.save_pretrained(tmp_path / "model"), "torch"),
        (model.export(tmp_path / "onnx"), "onnxruntime"),
    ):
        edited(folder, lambda description: description["config"]["decode"].update(top_p=float(TINY)))
        with raises_naming((ConfigError, CheckpointError), str(folder), "decode.top_p", TINY):
            captioning.load(folder, runtime=runtime)


@pytest.mark.parametrize("how", [("--top-p", TINY), ("--set", f"decode.top_p={TINY}")])
def test_evaluate_refuses_a_top_p_that_is_zero_in_32_bits_before_loading(how, photos, tmp_path, monkeypatch):
    from captioning.cli import evaluate as commands

    monkeypatch.setattr(commands, "load_for_tool", never)
    results = tmp_path / "captions.json"
    flags = ("--images", photos, "--results", results, "--strategy", "sample", "--no-progress")
    result = in_process("evaluate.py", "--checkpoint", FIXTURE, *flags, *how, cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "decode.top_p", TINY)
    assert not results.exists()


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"decode.top_p": TINY}, ("decode.top_p", TINY)),
        ({"decode.top_p": TINY, "train.epochs": 0, "train.scst_epochs": 1}, ("decode.top_p", TINY)),
        ({"train.lr": "1e-50"}, ("train.lr", "1e-50")),
        # rollouts of a million samples per image: refused before the first step, not at the first rollout
        (
            {"train.epochs": 0, "train.scst_epochs": 1, "train.scst_samples": 10**6},
            ("train.scst_samples 1000000", "train.batch_size", "lower train.scst_samples"),
        ),
        # 16,384 additive-attention layers of 512 x 512: about 64 GiB to train
        (
            {
                "model.decoder.scoring": "additive",
                "model.decoder.attention_dim": 512,
                "model.decoder.annotation_layers": 16384,
            },
            ("model.decoder.annotation_layers 16384", "lower model.decoder.annotation_layers"),
        ),
        ({"model.decoder.init_layers": 16384}, ("model.decoder.init_layers 16384",)),
    ],
    ids=["top_p", "top_p-self-critical", "lr", "rollouts", "annotation_layers", "init_layers"],
)
def test_train_refuses_what_its_run_will_need_before_the_plan(
    shapes, tmp_path, monkeypatch, overrides, needles
):
    monkeypatch.setattr(memory_bounds, "available_bytes", lambda device: 8 << 30)
    run = tmp_path / "run"
    result = in_process("train.py", "--no-test", *short_run(shapes, run, **overrides), cwd=REPO)
    assert_one_line_error(result.returncode, result.stderr, *needles)
    assert "plan:" not in result.stdout and not run.exists()  # no epoch, no checkpoint to lose


def per_hypothesis(vocab: int, positions: int, channels: int, max_length: int) -> int:
    """Bytes of one hypothesis, written out: 3 score rows of V, (P + 2) floats a word, the P x C grid."""
    return 4 * (3 * vocab + (max_length + 1) * (positions + 2) + positions * channels)


@pytest.mark.parametrize(
    ("options", "count", "named", "absent"),
    [
        ({"strategy": "sample", "num_return": 7}, 7, "decode.num_return 7", "beam_size"),
        ({"strategy": "beam", "beam_size": 5, "num_return": 3}, 5, "decode.beam_size 5", "num_return"),
        ({"strategy": "greedy"}, 1, "decode.batch_size", "beam_size"),
    ],
    ids=["sample", "beam", "greedy"],
)
def test_the_decoding_estimate_counts_each_hypothesis_copy_of_the_grid(
    options, count, named, absent, monkeypatch
):
    model = captioning.load(FIXTURE)
    pictures = [np.zeros((16, 16, 3), dtype=np.uint8)] * 3
    gh, gw = model.grid
    channels = model.captioner.decoder.annotation_dim
    assert channels == 1280 and gh * gw == 4  # efficientnet_lite0's channels over a 2 x 2 grid
    needed = 3 * count * per_hypothesis(len(model.vocab), gh * gw, channels, model.decode_config.max_length)
    monkeypatch.setattr(memory_bounds, "available_bytes", lambda device: needed - 1)
    with raises_naming(ConfigError, named, "3 images", "free on cpu") as caught:
        model.caption(pictures, **options)
    assert absent not in str(caught.value)
    monkeypatch.setattr(memory_bounds, "available_bytes", lambda device: needed)
    assert len(model.caption(pictures, **options)) == 3


def test_two_hundred_thousand_samples_are_refused_through_the_api(monkeypatch):
    from captioning.inference import captioner as runner

    monkeypatch.setattr(runner, "generate_captions", never)
    model = captioning.load(FIXTURE)
    monkeypatch.setattr(memory_bounds, "available_bytes", lambda device: 2 << 30)
    with raises_naming(ConfigError, "decode.num_return 200000", "lower --num-return"):
        model.caption([np.zeros((16, 16, 3), dtype=np.uint8)], strategy="sample", num_return=200000)


@pytest.mark.slow  # a process importing torch under an address-space limit
def test_two_hundred_thousand_samples_are_refused_under_a_real_memory_cap(photos, tmp_path):
    results = tmp_path / "captions.json"
    result = run_tool(  # torch's own address space and a tiny model; not 4 GiB more
        "evaluate.py",
        *("--checkpoint", FIXTURE, "--images", photos, "--results", results),
        *("--strategy", "sample", "--num-return", "200000", "--no-progress"),
        timeout=120,
        cwd=tmp_path,
        address_space=4 << 30,
    )
    assert_one_line_error(result.returncode, result.stderr, "decode.num_return 200000", "lower --num-return")
    assert "MemoryError" not in result.stderr and not results.exists()


@pytest.mark.slow  # a process importing torch under an address-space limit
def test_a_decoder_of_sixteen_thousand_layers_is_refused_under_a_real_memory_cap(tmp_path):
    folder = captioning.load(FIXTURE).save_pretrained(tmp_path / "model")
    edited(folder, lambda description: description["config"]["model"]["decoder"].update(init_layers=16384))
    result = run_tool(
        "evaluate.py",
        *("--checkpoint", folder, "--split", "test", "--no-java", "--no-progress"),
        timeout=120,
        cwd=tmp_path,
        address_space=4 << 30,
    )
    assert_one_line_error(result.returncode, result.stderr, "model.decoder.init_layers 16384", "free on cpu")
    assert "MemoryError" not in result.stderr
