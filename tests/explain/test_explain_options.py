"""``model.explain`` and ``evaluate.py --faithfulness`` check every option before any work, as ``caption``
does: types, ranges, baselines, costs (passes per word and memory), an ONNX Runtime model; each a one-line
project error naming the argument or the flag, with no image captioned and no results file written."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import assert_naming, raises_naming
from tiny_models import tiny_checkpoint
from tool_runs import REPO, in_process

import captioning
from captioning.data.shapes import ShapesFiles
from captioning.data.vocab import Vocabulary
from captioning.explain import explaining
from captioning.explain.config import MAX_ROWS_PER_WORD, ExplainConfig
from captioning.utils.errors import CaptioningError, InputError

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_shapes: ShapesFiles, shapes_vocab: Vocabulary):
    folder = tmp_path_factory.mktemp("run_options")
    return tiny_checkpoint(folder / "checkpoints" / "best.pt", tiny_shapes.root, shapes_vocab, "lstm")


@pytest.fixture
def model(checkpoint: Path, monkeypatch: pytest.MonkeyPatch):
    """The model, whose captioning and baseline work fail the test if any option check lets them run."""
    loaded = captioning.load(checkpoint, device="cpu")

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(loaded, "caption", no_work)
    monkeypatch.setattr(explaining, "training_mean", no_work)
    monkeypatch.setattr(explaining, "blurred_grids", no_work)
    return loaded


@pytest.fixture(scope="module")
def images(tiny_shapes: ShapesFiles) -> list[Path]:
    return sorted((tiny_shapes.root / "test").glob("*.png"))[:2]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ig_steps": 2.5}, "ig_steps"),
        ({"ig_steps": math.nan}, "ig_steps"),
        ({"ig_steps": "16"}, "ig_steps"),
        ({"ig_steps": True}, "ig_steps"),
        ({"ig_steps": 1}, "ig_steps"),  # captum needs two steps
        ({"ig_steps": 1e7}, "ig_steps"),
        ({"ig_steps": 10**7}, "ig_steps"),  # an integer, refused for its cost
        ({"curve_steps": 2.5}, "curve_steps"),
        ({"curve_steps": math.nan}, "curve_steps"),
        ({"curve_steps": math.inf}, "curve_steps"),
        ({"curve_steps": 10**7}, "curve_steps"),
        ({"curve_steps": 0}, "curve_steps"),
        ({"random_seeds": 10**9}, "random_seeds"),
        ({"random_seeds": 10**5, "curve_steps": 2}, "random_seeds"),
        ({"score": "softmax"}, "score"),
        ({"order_seed": -1}, "order_seed"),
        # real-valued settings in the range of what they are, as data.pointing_tolerance is
        ({"pointing_tolerance": -3.0}, "pointing_tolerance"),
        ({"pointing_tolerance": 0.0}, "pointing_tolerance"),
        ({"pointing_tolerance": 1e300}, "pointing_tolerance"),
        ({"sanity_threshold": 5.0}, "sanity_threshold"),  # a rank correlation: nothing is ever flagged
        ({"sanity_threshold": -7.0}, "sanity_threshold"),  # every method flagged
        ({"methods": ["attention", "no_such_method"]}, "no_such_method"),
        ({"methods": None}, "methods"),
        ({"methods": [1]}, "methods"),
        ({"methods": []}, "method"),
        ({"baseline": "mean"}, "baseline"),
        ({"baseline": [0.0] * 1280}, "baseline"),  # a list, not an array
        ({"baseline": np.zeros(7)}, "baseline"),  # the wrong number of channels
        ({"baseline": np.zeros((4, 1280))}, "baseline"),
        ({"baseline": np.full(1280, np.nan)}, "baseline"),
        ({"baseline": torch.full((1280,), math.inf)}, "baseline"),
        ({"curves": "yes"}, "curves"),
        ({"settings": {"ig_steps": 4}}, "settings"),
        ({"smoothing": 3}, "smoothing"),  # neither an explain nor a decoding option
        ({"beam_size": 2.5}, "beam_size"),  # caption's own options, checked as caption checks them
    ],
)
def test_explain_refuses_each_bad_option_before_any_work(model, images, options: dict, named: str):
    assert model.captioner.encoder.channels == 1280  # the baselines above are sized for it
    with raises_naming(CaptioningError, named):
        model.explain(images, **{"methods": ["attention", "integrated_gradients"], **options})


def test_explain_refuses_no_image_and_an_unreadable_one_before_any_work(model, images, tmp_path: Path):
    with raises_naming(InputError, "images"):
        model.explain([])
    with raises_naming(InputError, "images", "[image]"):
        model.explain(images[0])  # one image, not a list
    bad = tmp_path / "not_an_image.png"
    bad.write_text("text")
    with raises_naming(CaptioningError, "images[1]"):
        model.explain([images[0], bad])


def test_explain_bounds_every_count_by_its_passes_per_word(model, images):
    # the largest counts that fit, alone, with the default methods and control
    config = ExplainConfig()
    # by hand: each of the 5 methods' curves and the control's 3 seeds, 11 points, deletion and insertion
    curve = 2 * 11 * (5 + 3)
    assert config.rows_per_word() == 16 + curve
    largest_ig = MAX_ROWS_PER_WORD - curve
    ExplainConfig(ig_steps=largest_ig)
    with raises_naming(InputError, "ig_steps", f"{largest_ig + 1}"):
        ExplainConfig(ig_steps=largest_ig + 1)
    with raises_naming(InputError, "random_seeds", "--random-seeds"):
        ExplainConfig(random_seeds=10**6)


def test_explain_refuses_settings_whose_memory_the_machine_lacks(checkpoint: Path, images):
    """A real cap on the address space (prlimit): a pass of a million grids is refused naming
    batch_rows, before any image is captioned."""
    code = (
        "import captioning, resource\n"
        "from captioning.explain.config import ExplainConfig\n"
        f"model = captioning.load({str(checkpoint)!r}, device='cpu')\n"
        "model.caption = None  # any captioning would fail: the check comes first\n"
        "try:\n"
        f"    model.explain([{str(images[0])!r}], baseline='zeros', "
        "settings=ExplainConfig(batch_rows=10**6))\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    limit = 6 * 2**30  # room for torch and the model, not for 10**6 grids of 4 x 1280 float32
    result = subprocess.run(
        ["prlimit", f"--as={limit}", sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert_naming(result.stdout.strip(), "InputError", "batch_rows", "free")


def test_explain_on_an_onnx_runtime_model_is_refused_naming_it(checkpoint: Path, images, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    folder = captioning.load(checkpoint, device="cpu").export(tmp_path / "onnx")
    onnx_model = captioning.load(folder, runtime="onnxruntime")
    with raises_naming(InputError, "explain()", "PyTorch"):
        onnx_model.explain(images)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--ig-steps", "1"], "ig_steps"),
        (["--ig-steps", "100000000"], "ig_steps"),
        (["--ig-steps", "1e8"], "--ig-steps"),  # not an integer: argparse names the flag
        (["--curve-steps", "1000000000"], "curve_steps"),
        (["--random-seeds", "1000000000"], "random_seeds"),
        (["--random-seeds", "1e9"], "--random-seeds"),
        (["--baseline", "mean"], "--baseline"),
        (["--score", "softmax"], "--score"),
    ],
)
def test_evaluate_refuses_each_bad_count_before_decoding(checkpoint: Path, tmp_path: Path, flags, named):
    results = tmp_path / "results.json"
    result = in_process(
        "evaluate.py",
        "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress",
        "--results", results, "--faithfulness", "attention,integrated_gradients", *flags,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2
    assert_naming(result.stderr.strip().splitlines()[-1], named)
    assert not results.exists()  # nothing was decoded
