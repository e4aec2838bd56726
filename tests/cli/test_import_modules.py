"""``--import MODULE``: a user module, imported before the configuration is checked, can register an
encoder, an attention scorer and a decoder family that train.py, evaluate.py and visualize.py all use."""

from __future__ import annotations

import json
import sys

import pytest
from test_faults import assert_one_line_error
from tool_runs import in_process, run_tool

from captioning.hub.checkpoint import load_checkpoint

# A user's encoder in a dozen lines: torchvision's MobileNetV3-Small trunk (576 channels), random weights.
USER_ENCODER = """
import torchvision
from torchvision.transforms import InterpolationMode

from captioning.models.encoders import Backbone, register_encoder


@register_encoder("user_mobilenet")
def user_mobilenet(weights: str, image_size: int) -> Backbone:
    if weights != "none":
        raise ValueError(f"user_mobilenet has no published weights here, got {weights!r}")
    trunk = torchvision.models.mobilenet_v3_small(weights=None).features
    return Backbone(trunk, tuple(trunk.children()), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                    interpolation=InterpolationMode.BILINEAR, weights={"none": True})
"""

# A scorer and a decoder family of the user's: cosine scoring with a temperature, and the attention
# LSTM under its own kind whose configuration adds one option (the cosine temperature).
USER_DECODER = """
import dataclasses

from torch.nn import functional as F

from captioning.config import LSTMDecoderConfig
from captioning.models.attention import SCORERS, GeneralAttention
from captioning.models.base import register_decoder
from captioning.models.decoder import ShowAttendTellDecoder


class CosineAttention(GeneralAttention):
    def __init__(self, annotation_dim, hidden_dim, temperature):
        super().__init__(annotation_dim, hidden_dim)
        self.temperature = temperature

    def scores(self, prepared, query):
        keys = F.normalize(prepared.keys, dim=-1)  # (B, P, C)
        query = F.normalize(self.query_proj(query), dim=-1)  # (N, C)
        query = query.view(-1, prepared.group, keys.size(-1))  # (B, G, C)
        return (query @ keys.transpose(1, 2)).reshape(-1, 1, keys.size(1)) / self.temperature  # (N, 1, P)


@SCORERS.register("cosine_temperature")
def cosine_temperature(annotation_dim, hidden_dim, config):
    return CosineAttention(annotation_dim, hidden_dim, getattr(config, "temperature", 0.1))


@dataclasses.dataclass(frozen=True)
class CosineLSTMConfig(LSTMDecoderConfig):
    kind: str = "cosine_lstm"
    scoring: str = "cosine_temperature"
    temperature: float = 0.1  # cosine scores are divided by it


@register_decoder("cosine_lstm", CosineLSTMConfig)
class CosineLSTM(ShowAttendTellDecoder):
    pass
"""

TINY_RUN = {
    "model.encoder.name": "user_mobilenet",
    "model.encoder.weights": "none",
    "model.encoder.image_size": 64,
    "model.encoder.grid_size": 0,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 16,
    "model.decoder.attention_dim": 16,
    "data.shapes_train": 12,
    "data.shapes_val": 4,
    "data.shapes_test": 4,
    "data.shapes_image_size": 64,
    "train.epochs": 1,
    "train.scst_epochs": 0,
    "train.batch_size": 4,
    "train.schedule": "plateau",
    "train.ema_decay": 0.0,
    "decode.beam_size": 2,
    "decode.max_length": 6,
}


@pytest.fixture
def fresh_imports(monkeypatch, tmp_path):
    """``sys.path`` put back, and the user modules under ``tmp_path`` forgotten, after a tool run in this
    process imported them."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


@pytest.mark.slow
def test_an_encoder_and_a_decoder_a_user_module_registers_work_through_all_three_tools(tmp_path):
    module = tmp_path / "user_parts.py"
    module.write_text(USER_ENCODER + USER_DECODER)
    user_decoder = {
        "model.decoder.kind": "cosine_lstm",
        "model.decoder.scoring": "cosine_temperature",
        "model.decoder.temperature": 0.2,
    }
    run = tmp_path / "run"
    overrides = {**TINY_RUN, **user_decoder, "data.root": tmp_path / "shapes"}
    trained = run_tool(
        "train.py",
        "--import",
        module,
        "--output-dir",
        run,
        "--device",
        "cpu",
        "--no-test",
        "--no-progress",
        *[arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")],
    )
    assert trained.returncode == 0, trained.stderr
    checkpoint = run / "checkpoints" / "best.pt"
    stored = load_checkpoint(checkpoint)  # this process has not imported the user module: the raw entries
    assert stored["config"]["model"]["encoder"]["name"] == "user_mobilenet"
    assert stored["encoder_fingerprint"]["channels"] == 576
    decoder = stored["config"]["model"]["decoder"]
    assert (decoder["kind"], decoder["scoring"], decoder["temperature"]) == (
        "cosine_lstm",
        "cosine_temperature",
        0.2,
    )

    refused = run_tool(
        "evaluate.py", "--checkpoint", checkpoint, "--split", "test", "--no-java", "--no-progress"
    )
    assert refused.returncode == 2
    assert "cosine_lstm" in refused.stderr.strip().splitlines()[-1]
    assert "--import MODULE" in refused.stderr.strip().splitlines()[-1]

    evaluated = run_tool(
        "evaluate.py",
        "--import",
        module,
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--no-java",
        "--no-progress",
        "--device",
        "cpu",
        "--out",
        tmp_path / "scores.json",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "CIDEr-D" in json.loads((tmp_path / "scores.json").read_text())

    image = min((tmp_path / "shapes").rglob("*.png"))
    figures = tmp_path / "figures"
    drawn = run_tool(
        "visualize.py",
        image,
        "--import",
        module,
        "--checkpoint",
        checkpoint,
        "--out-dir",
        figures,
        "--no-progress",
        "--device",
        "cpu",
    )
    assert drawn.returncode == 0, drawn.stderr
    assert list(figures.glob("*.png"))


def test_the_module_is_imported_before_the_configuration_is_checked(tmp_path, fresh_imports):
    (tmp_path / "marks_its_import.py").write_text(
        "from pathlib import Path\nPath('imported').write_text('yes')\n"
    )
    result = in_process("train.py", "--import", "marks_its_import", "--set", "train.epochs=-1", cwd=tmp_path)
    assert result.returncode == 2
    assert (tmp_path / "imported").read_text() == "yes"  # found in the current folder, imported first
    assert "train.epochs" in result.stderr  # then the configuration was refused


@pytest.mark.parametrize(
    ("module_text", "argument", "expected"),
    [
        (None, "no_such_module_here", "--import no_such_module_here: no module named 'no_such_module_here'"),
        (None, "missing/encoders.py", "--import missing/encoders.py: no such file"),
        (
            "import no_such_dependency_here\n",
            "needs_a_dependency.py",
            "--import needs_a_dependency.py: ModuleNotFoundError: No module named 'no_such_dependency_here'",
        ),
        ("", "json.py", "--import"),  # a file that would replace a module already imported
    ],
)
def test_a_module_that_cannot_be_imported_is_a_one_line_error(
    tmp_path, fresh_imports, module_text, argument, expected
):
    if module_text is not None:
        (tmp_path / argument).write_text(module_text)
    result = in_process(
        "evaluate.py", "--import", argument, "--checkpoint", tmp_path / "never.pt", cwd=tmp_path
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), result.stderr
    if argument == "json.py":
        assert "'json'" in lines[0], lines[0]  # the module name it would shadow


BUGGY_MODULE = """
import torch


def project(grid):
    weight = torch.zeros(3, 5)
    return grid @ weight  # the user's bug: (2, 4) @ (3, 5)


project(torch.zeros(2, 4))
"""


@pytest.mark.parametrize(
    ("script", "arguments"),
    [
        ("train.py", ["--no-progress"]),
        ("evaluate.py", ["--checkpoint", "never.pt", "--split", "test"]),
        ("visualize.py", ["--checkpoint", "never.pt", "picture.png"]),
    ],
)
def test_a_bug_in_a_user_module_keeps_its_traceback_through_every_tool(
    tmp_path, fresh_imports, script, arguments
):
    """torch's RuntimeError from the user's own line is a bug, not an input problem: the tool prints
    the traceback down to that line, then one line saying so (exit status 1, not 2)."""
    (tmp_path / "buggy_user_module.py").write_text(BUGGY_MODULE)
    result = in_process(script, "--import", "buggy_user_module.py", *arguments, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):", result.stderr
    assert any("buggy_user_module.py" in line and "line 7, in project" in line for line in lines)
    assert any(line.strip() == "return grid @ weight  # the user's bug: (2, 4) @ (3, 5)" for line in lines)
    assert any("--import buggy_user_module.py" in line for line in lines[1:-2])  # the module it came from
    assert lines[-2].startswith("error: RuntimeError: ") and "mat1" in lines[-2]  # torch's own message
    assert "traceback" in lines[-1]  # the last line points at the traceback, not at the input


def test_a_path_to_a_file_python_cannot_import_is_a_one_line_error(tmp_path, fresh_imports):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "encoders.txt").write_text("x = 1\n")  # a path (it has a /), not a .py file
    result = in_process(
        "evaluate.py", "--import", "plugins/encoders.txt", "--checkpoint", tmp_path / "never.pt", cwd=tmp_path
    )
    assert_one_line_error(result.returncode, result.stderr, "--import plugins/encoders.txt", ".py")


def test_a_file_imported_by_an_earlier_run_in_the_process_is_not_run_again(tmp_path, fresh_imports):
    module = tmp_path / "counts_its_runs.py"
    module.write_text(
        "from pathlib import Path\nmark = Path(__file__).with_suffix('.runs')\n"
        "mark.write_text(mark.read_text() + 'x' if mark.exists() else 'x')\n"
    )
    for _ in range(2):
        result = in_process("train.py", "--import", module, "--set", "train.epochs=-1", cwd=tmp_path)
        assert result.returncode == 2 and "train.epochs" in result.stderr
    assert (tmp_path / "counts_its_runs.runs").read_text() == "x"


# A user's dataset reader with an option of its own: the captions of a Karpathy-format file, with
# every caption lower-cased unless data.lowercase is false.
USER_READER = """
import dataclasses

from captioning.config import KarpathySplitConfig
from captioning.data import DatasetReader, check_data_paths, read_karpathy, register_reader


@dataclasses.dataclass(frozen=True)
class LowerCaseConfig(KarpathySplitConfig):
    dataset: str = "user_lowercase"
    lowercase: bool = True  # lower-case every caption


@register_reader("user_lowercase", LowerCaseConfig)
class LowerCaseReader(DatasetReader):
    def read(self, config):
        check_data_paths(config)
        words = (lambda text: text.lower().split()) if config.lowercase else str.split
        return read_karpathy(config.split_file, config.root, tokenizer=words)
"""


@pytest.mark.slow
def test_a_dataset_reader_a_user_module_registers_trains_through_train_py(tmp_path):
    from tool_runs import run_tool

    from captioning.data import generate_shapes

    files = generate_shapes(tmp_path / "shapes", num_train=8, num_val=4, num_test=4, image_size=64)
    module = tmp_path / "user_readers.py"
    module.write_text(USER_READER)
    run = tmp_path / "run"
    overrides = {
        **{key: value for key, value in TINY_RUN.items() if not key.startswith("data.shapes_")},
        "model.encoder.name": "efficientnet_lite0",
        "model.encoder.weights": "pretrained",
        "data.dataset": "user_lowercase",
        "data.root": files.root,
        "data.split_file": files.split_file,
        "data.min_word_count": 1,
    }
    flags = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    common = ["--output-dir", run, "--device", "cpu", "--no-test", "--no-progress", *flags]
    refused = run_tool("train.py", *common)
    assert not run.exists()
    # its Karpathy options name the readers that have them, and the flag that registers the user's reader
    assert_one_line_error(
        refused.returncode,
        refused.stderr,
        "data.split_file",
        "karpathy",
        "coco",
        "data.dataset 'user_lowercase'",
        "--import",
    )
    refused = run_tool("train.py", *common, "--set", "data.lowercase=true")  # its option, without it
    assert not run.exists()
    assert_one_line_error(
        refused.returncode,
        refused.stderr,
        "'data.lowercase'",
        "data.dataset 'user_lowercase'",
        "--import",
        alone=False,
    )
    trained = run_tool("train.py", "--import", module, *common, "--set", "data.lowercase=true")
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((run / "data_summary.json").read_text())
    assert summary["dataset"] == "user_lowercase"
    assert summary["splits"]["train"] == {"images": 8, "captions": 40}
    stored = load_checkpoint(run / "checkpoints" / "last.pt")["config"]["data"]
    assert stored["dataset"] == "user_lowercase" and stored["lowercase"] is True
    assert not any(key.startswith("shapes_") for key in stored)


WRONG_ENCODERS = """
import torch
from torch import nn
from torchvision.transforms import InterpolationMode

from captioning.models.encoders import Backbone, register_encoder


def backbone(features, **changes):
    fields = dict(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), interpolation=InterpolationMode.BILINEAR,
                  weights={"none": True})
    fields.update(changes)
    return Backbone(features, (features,), **fields)


class Flat(nn.Module):
    def forward(self, images):
        return images.flatten(1)  # (B, 3*S*S): not a feature map


@register_encoder("returns_none")
def returns_none(weights, image_size):
    return None


@register_encoder("returns_a_network")
def returns_a_network(weights, image_size):
    return nn.Conv2d(3, 8, 3)


@register_encoder("two_means")
def two_means(weights, image_size):
    return backbone(nn.Conv2d(3, 8, 3), mean=(0.5, 0.5))


@register_encoder("flat_features")
def flat_features(weights, image_size):
    return backbone(Flat())
"""


WRONG_THINGS = [
    ("returns_none", "model.encoder.name 'returns_none': its builder returned NoneType, not a Backbone"),
    ("returns_a_network", "its builder returned Conv2d, not a Backbone"),
    ("two_means", "its builder returned Backbone.mean (0.5, 0.5); it needs 3 numbers (R, G, B)"),
    ("flat_features", "model.encoder.name 'flat_features': its Backbone.features returned shape (1, 12288)"),
]


def test_an_encoder_that_returns_the_wrong_thing_is_one_line_naming_it(tmp_path, fresh_imports):
    (tmp_path / "wrong_encoders.py").write_text(WRONG_ENCODERS)
    for name, expected in WRONG_THINGS:  # one module, imported once in this process
        overrides = {**TINY_RUN, "model.encoder.name": name, "data.root": tmp_path / "shapes"}
        result = in_process(
            "train.py",
            "--import",
            "wrong_encoders.py",
            "--output-dir",
            tmp_path / "run",
            "--no-progress",
            *[arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")],
            cwd=tmp_path,
        )
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert (
            "Traceback" not in result.stderr and lines[-1].startswith("error: ") and expected in lines[-1]
        ), lines


BUGGY_READER = """
from captioning.data.readers import DatasetReader, register_reader


@register_reader("buggy_reader_for_test")
class BuggyReader(DatasetReader):
    writes_root = True

    def read(self, config):
        return [int(text) for text in ("12", "twelve")]  # the user's bug: a bare ValueError
"""


def test_a_bare_value_error_from_a_user_module_is_a_bug_not_an_input_problem(tmp_path, fresh_imports):
    """A ValueError is no input problem unless the project raised it as one (``CaptioningError``): one
    raised by a user's own reader keeps its traceback down to the user's line."""
    (tmp_path / "buggy_reader.py").write_text(BUGGY_READER)
    result = in_process(
        "train.py",
        "--import",
        "buggy_reader.py",
        "--set",
        "data.dataset=buggy_reader_for_test",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):", result.stderr
    assert any("buggy_reader.py" in line and "in read" in line for line in lines)
    assert lines[-2].startswith("error: ValueError: ") and "'twelve'" in lines[-2]  # the kind and the value
    assert lines[-1].startswith("This is not a problem with the input")
