"""Hostile inputs against the newest surfaces: the hallucination testbed's options and the demo's POST
guard. Each bad value is refused in one line naming it before any work (nothing generated, nothing read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_faults import assert_one_line_error
from tool_runs import in_process

from captioning.cli.upload_guard import UploadGuard


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("data.shapes_seed", "-1"),  # numpy's seeds are non-negative: a traceback once images were drawn
        ("data.shapes_seed", str(10**23)),
        ("data.shapes_image_size", "1000000"),  # 3 TB of pixels an image
        ("data.shapes_train", str(10**12)),
        ("data.shapes_test", str(10**7)),
    ],
)
@pytest.mark.parametrize("config", ["configs/shapes_hallucination.yaml", "configs/shapes.yaml"])
def test_the_testbeds_counts_sizes_and_seed_are_bounded_before_anything_is_generated(
    tmp_path: Path, config: str, option: str, value: str
):
    root = tmp_path / "data"
    result = in_process(
        "train.py", "--config", str(Path(__file__).parents[2] / config), "--set", f"{option}={value}",
        "--set", f"data.root={root}", "--output-dir", str(tmp_path / "run"), "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(result.returncode, result.stderr, option, alone=False)
    assert not root.exists() and not (tmp_path / "run").exists()
