"""``train.py --cache-only`` under a real 2-process ``torchrun`` (gloo on CPU): each rank encodes about
half of the images, the cache is byte for byte the one a single process builds, and a rank killed
mid-build leaves rows that the next launch keeps, encoding only the missing ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_training import as_flags
from tool_runs import ONE_THREAD, REPO

from captioning.data.shapes import generate_shapes

pytestmark = pytest.mark.slow

IMAGES = 160  # train images; 4 val and 4 test are appended to the same cache folder
ROWS = IMAGES + 8

# Imported by train.py (--import) in every rank: records each row this process encodes, and its pid;
# CACHE_SLOW_S slows each image down so that a kill lands mid-build.
_COUNTING = """
import os, time
from captioning.data import cache_build

folder = os.environ["CACHE_COUNTS"]
rank = os.environ.get("RANK", "0")
with open(os.path.join(folder, f"rank{rank}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
read = cache_build._ImageFiles.__getitem__

def counted(self, index):
    time.sleep(float(os.environ.get("CACHE_SLOW_S", "0")))
    with open(os.path.join(folder, f"rank{rank}.rows"), "a") as handle:
        handle.write(f"{self.items[index][0]}\\n")
    return read(self, index)

cache_build._ImageFiles.__getitem__ = counted
"""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("distributed_cache")
    data = root / "data"
    generate_shapes(data, seed=0, num_train=IMAGES, num_val=4, num_test=4, image_size=64)
    module = root / "counting.py"
    module.write_text(_COUNTING)
    overrides = {
        "data.root": data,
        "data.shapes_train": IMAGES,
        "data.shapes_val": 4,
        "data.shapes_test": 4,
        "data.shapes_image_size": 64,
        "data.num_workers": 0,
        "model.encoder.image_size": 64,
        "model.encoder.grid_size": 0,
    }
    single = _cache_only(root / "single", overrides, module, processes=1)
    assert single.returncode == 0, single.stderr[-3000:]
    return SimpleNamespace(root=root, overrides=overrides, module=module, single=root / "single")


def _command(folder: Path, overrides: dict, module: Path, processes: int) -> list[str]:
    flags = as_flags({**overrides, "data.cache_dir": folder / "cache", "train.output_dir": folder / "run"})
    tool = [str(REPO / "train.py"), "--cache-only", "--no-progress", "--import", str(module), *flags]
    if processes == 1:
        return [sys.executable, *tool]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *tool]


def _environment(folder: Path, slow: float = 0.0) -> dict[str, str]:
    (folder / "counts").mkdir(parents=True, exist_ok=True)
    return {**ONE_THREAD, "CACHE_COUNTS": str(folder / "counts"), "CACHE_SLOW_S": str(slow)}


def _cache_only(folder: Path, overrides: dict, module: Path, processes: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(folder, overrides, module, processes),
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=_environment(folder),
    )


def _encoded(folder: Path, rank: int) -> list[int]:
    path = folder / "counts" / f"rank{rank}.rows"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _cache_files(folder: Path) -> dict[str, bytes]:
    """Every file of the cache folder (features, row states, index), by its path inside it."""
    files = {
        str(path.relative_to(folder / "cache")): path.read_bytes()
        for path in sorted((folder / "cache").rglob("*"))
        if path.is_file() and path.name != "build.lock"
    }
    assert {Path(name).name for name in files} >= {"features.npy", "state.bin", "index.json"}
    return files


def test_two_ranks_build_the_single_process_cache_each_encoding_half(shapes) -> None:
    folder = shapes.root / "two"
    result = _cache_only(folder, shapes.overrides, shapes.module, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _encoded(shapes.single, 0) and sorted(_encoded(shapes.single, 0)) == list(range(ROWS))
    ranks = [_encoded(folder, 0), _encoded(folder, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(ROWS))  # every row encoded once, by one rank
    assert all(abs(len(rows) - ROWS / 2) <= 8 for rows in ranks), [len(rows) for rows in ranks]
    assert _cache_files(folder) == _cache_files(shapes.single)


def test_a_rank_killed_mid_build_resumes_to_the_same_bytes(shapes) -> None:
    folder = shapes.root / "killed"
    environment = _environment(folder, slow=0.05)
    with open(folder / "killed.log", "w") as log:
        process = subprocess.Popen(
            _command(folder, shapes.overrides, shapes.module, 2),
            cwd=REPO,
            stdout=log,
            stderr=log,
            env=environment,
        )
    deadline, killed = time.time() + 300, False
    while time.time() < deadline and process.poll() is None:
        if len(_encoded(folder, 1)) >= 24 and (folder / "counts" / "rank1.pid").exists():
            os.kill(int((folder / "counts" / "rank1.pid").read_text()), signal.SIGKILL)
            killed = True
            break
        time.sleep(0.05)
    process.wait(timeout=120)
    assert killed and process.returncode != 0, (folder / "killed.log").read_text()[-3000:]
    states = np.fromfile(next((folder / "cache").glob("*/state.bin")), dtype=np.uint8)
    kept = set(np.flatnonzero(states == 1).tolist())
    assert 0 < len(kept) < IMAGES  # rows of both ranks survived the kill; some are left to do

    for name in ("rank0.rows", "rank1.rows"):
        (folder / "counts" / name).unlink(missing_ok=True)
    result = _cache_only(folder, shapes.overrides, shapes.module, processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    again = _encoded(folder, 0) + _encoded(folder, 1)
    assert sorted(again) == sorted(set(range(ROWS)) - kept)  # only the missing rows, each once
    assert _encoded(folder, 0) and _encoded(folder, 1)  # shared by both ranks again
    assert _cache_files(folder) == _cache_files(shapes.single)
