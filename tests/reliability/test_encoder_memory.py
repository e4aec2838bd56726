"""An encoder's passes are bounded by what their activations cost, before any work: the bytes are
measured on meta tensors when the encoder is built and compared with the memory free (and the room an
address-space limit leaves), so that ``model.encoder.image_size=4096`` is one line naming the key,
not a process the kernel kills or a raw allocator traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_faults import assert_one_line_error
from tool_runs import REPO, in_process, run_tool

import captioning
from captioning.config import ConfigError
from captioning.models.encoders import activations
from captioning.models.encoders.activations import ActivationMeter

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


def test_the_meter_counts_what_is_alive_at_once_and_all_that_was_made():
    side = 16
    network = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, padding=1)
    )
    state = {key: value.to("meta") for key, value in network.state_dict().items()}
    plane = side * side * 4  # bytes of one float32 channel
    with torch.no_grad(), ActivationMeter() as meter:
        image = torch.empty(1, 3, side, side, device="meta")
        output = torch.func.functional_call(network, state, (image,))
    # the image (3) and the first convolution's output (8) are alive while the ReLU makes its own (8);
    # the first output is then dropped before the last convolution (4)
    assert meter.peak == (3 + 8 + 8) * plane
    assert meter.total == (3 + 8 + 8 + 4) * plane
    assert meter.live == (3 + 4) * plane  # what the test still holds
    assert tuple(output.shape) == (1, 4, side, side)


def big_model_folder(folder: Path, image_size: int = 4096) -> Path:
    """The fixture's model saved as a folder whose encoder reads images of ``image_size`` pixels."""
    saved = Path(captioning.load(FIXTURE).save_pretrained(folder))
    description = json.loads((saved / "config.json").read_text(encoding="utf-8"))
    description["config"]["model"]["encoder"]["image_size"] = image_size
    (saved / "config.json").write_text(json.dumps(description), encoding="utf-8")
    return saved


def test_the_python_api_refuses_an_image_size_whose_activations_do_not_fit(tmp_path, monkeypatch):
    model = captioning.load(big_model_folder(tmp_path / "model"))
    peak, _ = model.captioner.encoder.activation_bytes
    assert 3 << 30 < peak < 5 << 30  # efficientnet_lite0 at 4096 px: about 3.8 GiB per image
    monkeypatch.setattr(activations, "available_bytes", lambda device: 1 << 30)
    picture = np.zeros((16, 16, 3), dtype=np.uint8)
    message = (
        r"^model.encoder.image_size 4096: efficientnet_lite0's activations for 1 image per pass need about"
    )
    with pytest.raises(ConfigError, match=message + r" 3\.\d GiB .*the 1\.0 GiB free on cpu; lower model"):
        model.caption([picture])
    with pytest.raises(ConfigError, match=r"for 4 images per pass .* or decode\.batch_size$"):
        model.caption([picture] * 4, batch_size=8)


def test_train_refuses_an_image_size_whose_activations_do_not_fit_before_reading_the_data(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(activations, "available_bytes", lambda device: 8 << 30)
    flags = [
        *("--set", "model.encoder.weights=none", "--set", "model.encoder.image_size=4096"),
        *("--set", f"data.root={tmp_path / 'shapes'}", "--set", f"train.output_dir={tmp_path / 'run'}"),
    ]
    cached = in_process("train.py", "--no-progress", *flags, cwd=tmp_path, timeout=60)
    assert_one_line_error(
        cached.returncode,
        cached.stderr,
        "model.encoder.image_size 4096: efficientnet_lite0's activations for 8 images per pass need about 30",
        "more than the 8.0 GiB free on cpu; lower model.encoder.image_size",
        alone=False,  # a busy machine's note may come first
    )
    tuned = in_process(
        "train.py",
        "--no-progress",
        *flags,
        "--set",
        "model.encoder.fine_tune_stages=1",
        cwd=tmp_path,
        timeout=60,
    )
    assert_one_line_error(
        tuned.returncode,
        tuned.stderr,
        "activations kept for fine-tuning for 16 images",
        "or train.batch_size",
    )
    assert list(tmp_path.iterdir()) == []  # no Shapes data generated, no run folder


@pytest.mark.slow  # a process importing torch under an address-space limit
def test_evaluate_names_the_image_size_under_a_real_memory_cap(tmp_path):
    folder = big_model_folder(tmp_path / "model")
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(photos / "small.png")
    result = run_tool(  # torch's own address space and a tiny model; not 3.8 GiB more
        "evaluate.py",
        *("--checkpoint", folder, "--images", photos, "--results", tmp_path / "captions.json"),
        "--no-progress",
        timeout=120,
        cwd=tmp_path,
        address_space=4 << 30,
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        "model.encoder.image_size 4096: efficientnet_lite0's activations for 1 image per pass need about 3.",
        "free on cpu; lower model.encoder.image_size",
        alone=False,
    )
    assert "MemoryError" not in result.stderr
    assert not (tmp_path / "captions.json").exists()
