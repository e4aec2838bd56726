"""A tool run in the test process (tests/tool_runs.py) gives what a subprocess gives and leaves the
process as it found it, so later tests in the same worker do not depend on it."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest
import torch
from test_faults import shapes
from test_hostile import short_run
from tool_runs import in_process, run_tool

__all__ = ["shapes"]  # the module-scoped fixture of test_faults


@pytest.mark.slow
def test_a_run_in_this_process_leaves_the_process_as_it_found_it(shapes, tmp_path):
    before = (
        os.getcwd(),
        list(sys.argv),
        torch.get_rng_state(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        signal.getsignal(signal.SIGTERM),
        signal.getsignal(signal.SIGALRM),
        list(logging.getLogger("captioning").handlers),
    )
    result = in_process(
        "train.py",
        "--no-test",
        *short_run(shapes, tmp_path / "run", **{"train.deterministic": True, "train.seed": 7}),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "plan: " in result.stdout  # what the tool printed is the result's, as from a subprocess
    after = (
        os.getcwd(),
        list(sys.argv),
        torch.get_rng_state(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        signal.getsignal(signal.SIGTERM),
        signal.getsignal(signal.SIGALRM),
        list(logging.getLogger("captioning").handlers),
    )
    assert torch.equal(after[2], before[2])
    assert after[:2] == before[:2] and after[3:] == before[3:]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left to go off in a later test


@pytest.mark.slow
def test_an_argparse_error_gives_the_same_exit_status_and_line_as_a_subprocess(tmp_path):
    here = in_process("evaluate.py", "--frobnicate", "3", cwd=tmp_path)
    there = run_tool("evaluate.py", "--frobnicate", "3", cwd=tmp_path)
    assert (here.returncode, here.stderr.splitlines()[-1]) == (
        there.returncode,
        there.stderr.splitlines()[-1],
    )
    assert here.stderr.splitlines()[-1].startswith("evaluate.py: error: ")
