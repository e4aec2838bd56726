"""Every file of a model folder, ``model.safetensors`` included, gets the permissions of a file the
user creates (0666 less the umask), though safetensors writes its own 0600 file and renames it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tool_runs import REPO

import captioning

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_save_pretrained_follows_the_umask(tmp_path: Path, umask: int) -> None:
    model = captioning.load(FIXTURE)
    previous = os.umask(umask)
    try:
        folder = model.save_pretrained(tmp_path / "model")
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in Path(folder).iterdir()}
    assert "model.safetensors" in modes
    assert modes == dict.fromkeys(modes, 0o666 & ~umask), modes
