"""An ONNX export captions without torch: in a process where torch and torchvision cannot be imported,
and (slow) in a fresh virtual environment holding only the package and its ``onnx-runtime`` extra,
``captioning.load(folder, runtime="onnxruntime")`` gives the PyTorch model's words on the Shapes test
images, greedy and beam 3, and neither ``import captioning`` nor captioning loads torch."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tiny_models import tiny_checkpoint

import captioning

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = [{"strategy": "greedy", "max_length": 8}, {"strategy": "beam", "beam_size": 3, "max_length": 8}]

# Run by the interpreter under test: torch and torchvision refused when BLOCK is set, the modules
# loaded after ``import captioning`` and after captioning, and the captions, as JSON on stdout.
SCRIPT = """
import json, sys
if {block}:
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchvision"):
                raise ModuleNotFoundError(f"No module named {{name!r}}")
    sys.meta_path.insert(0, Refuse())
import captioning
after_import = sorted(m for m in ("torch", "torchvision", "matplotlib") if m in sys.modules)
model = captioning.load({folder!r}, runtime="onnxruntime")
captions = [model.caption({images!r}, **options) for options in {options!r}]
print(json.dumps({{
    "after_import": after_import,
    "after_caption": sorted(m for m in ("torch", "torchvision") if m in sys.modules),
    "module": captioning.__file__,
    "words": [[c.words for c in run] for run in captions],
    "log_probs": [[c.log_prob for c in run] for run in captions],
}}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_shapes, shapes_vocab):
    """A tiny LSTM over the pretrained encoder, its export, the test images and its PyTorch captions."""
    folder = tmp_path_factory.mktemp("no_torch")
    checkpoint = tiny_checkpoint(
        folder / "best.pt", tiny_shapes.root, shapes_vocab, "lstm", encoder_weights="pretrained"
    )
    model = captioning.load(checkpoint, device="cpu")
    images = [str(p) for p in sorted((tiny_shapes.root / "test").glob("*.png"))]
    expected = [model.caption(images, **options) for options in OPTIONS]
    return model.export(folder / "onnx"), images, expected


def _run(python: str, exported, block: bool, env: dict[str, str] | None = None) -> dict:
    folder, images, _ = exported
    script = SCRIPT.format(block=block, folder=str(folder), images=images, options=OPTIONS)
    done = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, timeout=600, env=env, cwd=folder.parent
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(result: dict, expected) -> None:
    assert result["after_import"] == [] and result["after_caption"] == []
    for run, want in zip(result["words"], expected, strict=True):
        assert run == [c.words for c in want]
    for run, want in zip(result["log_probs"], expected, strict=True):
        assert run == pytest.approx([c.log_prob for c in want], abs=1e-4)


def test_the_onnx_path_captions_where_torch_cannot_be_imported(exported):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = _run(sys.executable, exported, block=True, env=env)
    assert Path(result["module"]).resolve().is_relative_to(ROOT)
    _check(result, exported[2])


def _extra(name: str) -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["options.extras_require"][name].splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@pytest.mark.slow
def test_a_fresh_environment_with_only_the_onnx_runtime_extra_captions_as_pytorch(exported, tmp_path):
    """``pip install --no-deps`` of the package, then the extra's requirements alone (pip's cache makes
    a second run quick); torch is not there to import."""
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = str(environment / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, timeout=600, capture_output=True)
    subprocess.run([*pip, *_extra("onnx-runtime")], check=True, timeout=600, capture_output=True)
    listed = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    assert "torch" not in listed.lower()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = _run(python, exported, block=False, env={**env, "OMP_NUM_THREADS": "1"})
    assert Path(result["module"]).resolve().is_relative_to(environment)
    _check(result, exported[2])
