"""A real ``ulimit -f`` (RLIMIT_FSIZE) while a tool writes: one line naming the file, nothing half-written.

Python ignores SIGXFSZ, so a write past the limit fails with EFBIG ("File too large"); the tools say
which file and that the previous one is intact (``utils.files.atomic_write``).
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from PIL import Image
from tool_runs import ONE_THREAD, REPO

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


@pytest.mark.slow
def test_visualize_under_a_file_size_limit_names_the_figure(tmp_path):
    Image.new("RGB", (200, 150), (200, 30, 30)).save(tmp_path / "photo.png")
    out = tmp_path / "figures"
    out.mkdir()
    (out / "photo.png").write_bytes(b"the previous figure")
    limit = 10 * 1024  # bytes: the figure (about 24 KB) does not fit

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, str(REPO / "visualize.py"), str(tmp_path / "photo.png")]
    command += ["--checkpoint", str(FIXTURE), "--out-dir", str(out), "--no-progress"]
    result = subprocess.run(
        command, capture_output=True, text=True, env=ONE_THREAD, preexec_fn=cap, check=False, timeout=300
    )
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {out / 'photo.png'}: ")  # the file
    assert "ulimit -f" in line and "previous file is intact" in line, line  # the cause, what is kept
    assert "Traceback" not in result.stderr
    assert (out / "photo.png").read_bytes() == b"the previous figure"
    assert sorted(p.name for p in out.iterdir()) == ["photo.png"]  # no temporary file left
