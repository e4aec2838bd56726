"""A checkpoint that names a part a user module registers: the Python caller is told to import it
(or to pass ``imports=``), not the command line's ``--import``, and ``imports=`` loads it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tool_runs import ONE_THREAD, REPO

USER_ENCODER = """
from torch import nn
from torchvision.transforms import InterpolationMode

from captioning.models.encoders import Backbone, register_encoder


@register_encoder("user_tiny")
def user_tiny(weights, image_size):
    trunk = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=4))
    return Backbone(trunk, tuple(trunk), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                    interpolation=InterpolationMode.BILINEAR, weights={"none": True})
"""

SAVE = """
import sys
sys.path.insert(0, sys.argv[2])
import user_parts  # registers user_tiny
from captioning.config.loading import load_config
from captioning.data.vocab import Vocabulary
from captioning.hub.checkpoint import save_checkpoint
from captioning.models.captioner import Captioner

config = load_config(None, {"model.encoder.name": "user_tiny", "model.encoder.weights": "none",
                            "model.encoder.image_size": 64, "model.decoder.embed_dim": 8,
                            "model.decoder.hidden_dim": 8, "model.decoder.attention_dim": 8})
vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "dog"])
model = Captioner.build(config.model, vocab)
save_checkpoint(sys.argv[1], config=config, vocab=vocab, decoder_state=model.decoder.state_dict(),
                encoder_state=model.encoder.state_dict(), encoder_fingerprint=model.encoder.fingerprint())
"""

LOAD = """
import sys
import captioning
from captioning.utils.errors import CaptioningError
try:
    captioning.load(sys.argv[1], device="cpu")
except CaptioningError as error:
    print("refused:", error)
model = captioning.load(sys.argv[1], device="cpu", imports=[sys.argv[2]])
print("loaded:", model.config.model.encoder.name)
"""


def python(script: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        env={**ONE_THREAD, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=300,
    )


@pytest.mark.slow
def test_a_python_caller_is_told_to_import_and_imports_loads(tmp_path):
    (tmp_path / "user_parts.py").write_text(USER_ENCODER)
    checkpoint = tmp_path / "user.pt"
    saved = python(SAVE, checkpoint, tmp_path)
    assert saved.returncode == 0, saved.stderr
    loaded = python(LOAD, checkpoint, tmp_path / "user_parts.py")
    assert loaded.returncode == 0, loaded.stderr
    refused, done = loaded.stdout.strip().splitlines()
    assert refused.startswith(f"refused: {checkpoint}")  # the file, the key and value, the fix
    assert all(name in refused for name in ("model.encoder.name", "'user_tiny'", "imports=[MODULE]")), refused
    assert done == "loaded: user_tiny"
