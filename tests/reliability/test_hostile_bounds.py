"""Every size and count is bounded before work: decoding lengths and beams, bootstrap resamples,
model sizes, a feature cache whose files are not what they should be, and benchmarks/speed.py's flags.

The tools run in this process (tests/tool_runs.py), benchmarks/speed.py as a real process.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest
from test_evaluation_tools import files
from test_faults import assert_one_line_error, shapes
from test_hostile import short_run, with_stored
from test_hostile_folders import read_only_mount
from tool_runs import ONE_THREAD, REPO, in_process

from captioning.config import MAX_DECODE_LENGTH

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["files", "read_only_mount", "shapes"]  # fixtures of other test modules


def never(*args, **kwargs):
    raise AssertionError("work started before the bound was checked")


# ------------------------------------------------------------------ decoding


def test_a_runaway_max_length_is_refused_from_the_flag_and_from_a_checkpoint(shapes, tmp_path, monkeypatch):
    from captioning.cli import evaluate as commands

    args = ["--split", "test", "--no-java", "--no-progress"]
    monkeypatch.setattr(commands, "load_for_tool", never)
    result = in_process(
        "evaluate.py", "--checkpoint", shapes.checkpoint, *args, "--max-length", 10**9, cwd=tmp_path
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"decode.max_length must be in [1, {MAX_DECODE_LENGTH}], got 1000000000",
    )
    monkeypatch.undo()
    stored = with_stored(
        shapes.checkpoint,
        tmp_path / "run" / "checkpoints" / "long.pt",
        lambda payload: payload["config"]["decode"].update(max_length=10**9),
    )
    result = in_process("evaluate.py", "--checkpoint", stored, *args, cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, str(stored), "decode.max_length must be in")
    assert not list((tmp_path / "run").glob("eval_*"))


def test_a_beam_wider_than_the_vocabulary_is_refused_before_decoding(shapes, tmp_path, monkeypatch):
    from captioning.inference import captioner as runner

    monkeypatch.setattr(runner, "generate_captions", never)
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--split",
        "test",
        "--no-java",
        "--no-progress",
        "--beam-size",
        10**8,
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"decode.beam_size (--beam-size) must be at most the vocabulary's {len(shapes.vocab)} "
        "words, got 100000000",
    )


def test_resamples_beyond_the_memory_are_refused_before_scoring(files, tmp_path, monkeypatch):
    from captioning.evaluation import compare

    monkeypatch.setattr(compare, "score_captions", never)
    result = in_process(
        "evaluate.py",
        "--compare",
        files["a"],
        files["b"],
        "--annotations",
        files["refs"],
        "--no-java",
        "--resamples",
        10**9,
        cwd=tmp_path,
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        "--resamples: 1000000000 resamples of 40 images need",
        "available; at most",
    )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            {"model.decoder.kind": "transformer", "model.decoder.num_heads": 0},
            "model.decoder.num_heads must be in [1, 16384], got 0",
        ),
        ({"train.scst_epochs": 1, "train.scst_samples": 0}, "train.scst_samples must be >= 1, got 0"),
    ],
)
def test_sizes_that_cannot_work_are_refused_before_the_data_are_read(shapes, tmp_path, overrides, needle):
    result = in_process("train.py", "--no-test", *short_run(shapes, tmp_path / "run", **overrides), cwd=REPO)
    # A kind set on the command line over the Shapes file says which of its LSTM options it leaves out.
    assert_one_line_error(
        result.returncode, result.stderr, needle, alone="model.decoder.kind" not in overrides
    )
    assert "plan:" not in result.stdout and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ a feature cache in odd states


def cache_copy(shapes, tmp_path):
    """A copy of the Shapes feature cache, and the folder of its one encoder key."""
    cache = tmp_path / "cache"
    shutil.copytree(shapes.root / "features", cache)
    (folder,) = [path.parent for path in cache.rglob("index.json")]
    return cache, folder


def test_a_fifo_in_a_feature_cache_is_named_instead_of_waited_on(shapes, tmp_path):
    cache, folder = cache_copy(shapes, tmp_path)
    (folder / "features.npy").unlink()
    os.mkfifo(folder / "features.npy")
    needle = f"{folder / 'features.npy'}: not a regular file (a FIFO); delete the folder {folder}"
    result = in_process(
        "train.py",
        "--no-test",
        *short_run(shapes, tmp_path / "run", **{"data.cache_dir": cache}),
        cwd=REPO,
        timeout=120,
    )
    assert_one_line_error(result.returncode, result.stderr, needle)
    result = in_process(
        "evaluate.py",
        "--checkpoint",
        shapes.checkpoint,
        "--split",
        "test",
        "--no-java",
        "--no-progress",
        "--set",
        f"data.cache_dir={cache}",
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(result.returncode, result.stderr, needle)


def test_damaged_row_states_are_recomputed_not_blamed_on_a_healthy_image(shapes, tmp_path):
    cache, folder = cache_copy(shapes, tmp_path)
    (folder / "state.bin").write_bytes(b"\x02\x02")  # cut to two bytes that say "unreadable"
    result = in_process(
        "train.py", "--no-test", *short_run(shapes, tmp_path / "run", **{"data.cache_dir": cache}), cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert f"{folder / 'state.bin'}" in result.stderr and "recomputing" in result.stderr
    assert "unreadable when its features were computed" not in result.stderr + result.stdout
    assert set((folder / "state.bin").read_bytes()) == {1}  # every row computed again


# ------------------------------------------------------------------ benchmarks/speed.py


@pytest.mark.slow
def test_speed_flags_out_of_bounds_are_refused_in_one_line_before_measuring(read_only_mount, monkeypatch):
    speed = _import_benchmark("speed")
    monkeypatch.setattr(speed, "matmul_peak", never)  # the first measurement
    cores = len(os.sched_getaffinity(0))
    cases = [
        (["--device", "tpu"], "--device: must be cpu, cuda or cuda:N, got 'tpu'"),
        (
            ["--threads", "-1"],
            f"--threads: must be between 0 (all usable cores) and the {cores} usable cores",
        ),
        (["--threads", "100000"], "got 100000"),
        (["--repeats", "0"], "--repeats: must be at least 1, got 0"),
        (
            ["--parts", "loader", "--loader-dir", str(read_only_mount)],
            f"{read_only_mount}: --loader-dir: cannot write in it (read-only file system)",
        ),
    ]
    for flags, needle in cases:
        with pytest.raises(SystemExit) as stop:
            speed.run_parts(speed.get_args_parser().parse_args(["--quick", *flags]))
        message = str(stop.value.code)
        assert needle in message and "\n" not in message, (flags, message)
    # The real tool: refused in one line, where OpenMP crashed on that many threads.
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speed.py"), "--quick", "--threads", "100000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
        check=False,
    )
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"--threads: must be between 0 (all usable cores) and the {cores} usable cores, got 100000"
    ], result.stderr


def _import_benchmark(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
