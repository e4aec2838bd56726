"""``train.py --cache-only`` as a real process, alone or under a 2-process ``torchrun`` (gloo on CPU),
with every rank recording the rows it encodes.

- ``cache_only(folder, overrides, processes)``: run it to the end; the cache goes to ``folder/cache``,
  the run folder to ``folder/run``, each rank's record to ``folder/counts``.
- ``command(folder, overrides, processes)`` and ``environment(folder, slow)``: the same, for a
  ``Popen`` that a test signals mid-build (``slow`` seconds per image, so that a signal lands there).
- ``encoded(folder, rank)``: the rows rank ``rank`` encoded, in order; ``encoded_paths``: their images.
- ``listed_shards(folder, rank)``: the shards rank ``rank`` listed from their tar headers.
- ``rank_pid(folder, rank)``: the process id of rank ``rank`` once it has started encoding.
- ``signal_rank_mid_build(folder, overrides, signal_number, after)``: a slowed 2-process build whose
  rank 1 gets a real signal once it has encoded ``after`` rows; torchrun's exit status and output.
- ``cache_files(folder)``: every file of the cache (features, row states, index), to compare bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tool_runs import ONE_THREAD, REPO

# Imported by train.py (--import) in every rank: records each row this process encodes with its image,
# each shard it lists from its tar headers, and its pid; CACHE_SLOW_S slows each image down so that a
# signal lands mid-build.
COUNTING = """
import os, time
from captioning.data import cache_build

folder = os.environ["CACHE_COUNTS"]
rank = os.environ.get("RANK", "0")
with open(os.path.join(folder, f"rank{rank}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
read = cache_build._ImageFiles.__getitem__

def counted(self, index):
    time.sleep(float(os.environ.get("CACHE_SLOW_S", "0")))
    row, record = self.items[index]
    with open(os.path.join(folder, f"rank{rank}.rows"), "a") as handle:
        handle.write(f"{row}\\t{record.path}\\n")
    return read(self, index)

cache_build._ImageFiles.__getitem__ = counted

from captioning.data import tar_members
scan = tar_members.scan_shard

def listed(shard):
    with open(os.path.join(folder, f"rank{rank}.scans"), "a") as handle:
        handle.write(f"{shard}\\n")
    return scan(shard)

tar_members.scan_shard = listed
"""


def _counting_module(folder: Path) -> Path:
    module = folder / "counting.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(COUNTING)
    return module


def command(folder: Path, overrides: dict, processes: int) -> list[str]:
    """The ``--cache-only`` command line: ``python train.py`` alone, or under torchrun with 2 processes."""
    settings = {**overrides, "data.cache_dir": folder / "cache", "train.output_dir": folder / "run"}
    flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    module = _counting_module(folder)
    tool = [str(REPO / "train.py"), "--cache-only", "--no-progress", "--import", str(module), *flags]
    if processes == 1:
        return [sys.executable, *tool]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *tool]


def environment(folder: Path, slow: float = 0.0) -> dict[str, str]:
    (folder / "counts").mkdir(parents=True, exist_ok=True)
    return {**ONE_THREAD, "CACHE_COUNTS": str(folder / "counts"), "CACHE_SLOW_S": str(slow)}


def cache_only(folder: Path, overrides: dict, processes: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(folder, overrides, processes),
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment(folder),
    )


def _lines(folder: Path, rank: int) -> list[list[str]]:
    path = folder / "counts" / f"rank{rank}.rows"
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def encoded(folder: Path, rank: int) -> list[int]:
    return [int(row) for row, _ in _lines(folder, rank)]


def encoded_paths(folder: Path, rank: int) -> list[str]:
    return [path for _, path in _lines(folder, rank)]


def listed_shards(folder: Path, rank: int) -> list[str]:
    path = folder / "counts" / f"rank{rank}.scans"
    return path.read_text().splitlines() if path.exists() else []


def forget_encoded(folder: Path) -> None:
    """Clear the ranks' records of encoded rows and listed shards (before a run that resumes the build)."""
    for pattern in ("rank*.rows", "rank*.scans"):
        for path in (folder / "counts").glob(pattern):
            path.unlink()


def rank_pid(folder: Path, rank: int) -> int | None:
    path = folder / "counts" / f"rank{rank}.pid"
    return int(path.read_text()) if path.exists() and path.read_text() else None


def cache_files(folder: Path) -> dict[str, bytes]:
    """Every file of the cache folder (features, row states, index), by its path inside it."""
    files = {
        str(path.relative_to(folder / "cache")): path.read_bytes()
        for path in sorted((folder / "cache").rglob("*"))
        if path.is_file() and path.name != "build.lock"
    }
    assert {Path(name).name for name in files} >= {"features.npy", "state.bin", "index.json"}
    return files


def signal_rank_mid_build(folder: Path, overrides: dict, signal_number: int, after: int) -> tuple[int, str]:
    """Start the 2-process build (each image slowed by 0.05 s), send ``signal_number`` to rank 1 once it
    has encoded ``after`` rows, and wait for torchrun to end.

    Returns:
        torchrun's exit status and output; the test fails when the build ended before the signal.
    """
    log_path = folder / "signalled.log"
    folder.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(folder, overrides, 2),
            cwd=REPO,
            stdout=log,
            stderr=log,
            env=environment(folder, slow=0.05),
        )
    deadline, sent = time.time() + 300, False
    while time.time() < deadline and process.poll() is None:
        pid = rank_pid(folder, 1)
        if len(encoded(folder, 1)) >= after and pid is not None:
            os.kill(pid, signal_number)
            sent = True
            break
        time.sleep(0.05)
    process.wait(timeout=120)
    output = log_path.read_text()
    assert sent, f"the build ended before rank 1 encoded {after} rows: {output[-3000:]}"
    return process.returncode, output
