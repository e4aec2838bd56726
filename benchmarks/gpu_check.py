"""One call on a CUDA machine: the CUDA tests and the GPU benchmarks, printed as one JSON object.

    python benchmarks/gpu_check.py            # about 6 minutes on one GPU, at most 10

It runs, each in its own process with its own time limit (the five add up to 9.5 minutes):

- ``pytest -m cuda tests``: mixed-precision steps against float32, the compiled step against eager,
  GPU beam search against CPU beam search (``tests/training/test_cuda.py``);
- ``speed.py --device cuda --amp``: the LSTM's training step (bf16 and float32), beam search, the
  feature cache and the COCO epoch estimate (``coco_epoch_s``);
- ``speed.py --parts transformer --device cuda``: the Transformer decoder's step and beam search;
- ``speed.py --parts scst,caption --device cuda``: the self-critical step beside the framework's and
  our cross-entropy step, and a folder of photos captioned beside the tutorial's per-image path;
- ``gpu_study.py --device cuda``: a small faithfulness study (32 Shapes images at 288 px, every
  method, grid curves, 3 random seeds, the cascade on 8 images; RISE's pixel protocol on 4), timed,
  its areas compared with the same study on the CPU on 2 images.

A part that fails or runs out of time is reported under its key (``error``, the last lines it
printed) and the others still run. Without CUDA it prints one line saying so and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import torch

ROOT = Path(__file__).resolve().parent.parent
SPEED = ROOT / "benchmarks" / "speed.py"
STUDY = ROOT / "benchmarks" / "gpu_study.py"
# Seconds per part; together under 10 minutes with the start-up of each process.
TESTS_S, SPEED_S, TRANSFORMER_S, SCST_CAPTION_S, STUDY_S = 110, 150, 100, 100, 110


def run(command: list[str], limit: float) -> tuple[subprocess.CompletedProcess | None, str]:
    """``command`` from the checkout's root with a time limit.

    Returns:
        The finished process (None if it did not finish) and what went wrong ("" if nothing).
    """
    try:
        completed = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"stopped after {limit:.0f} s"
    if completed.returncode != 0:
        return completed, f"exit status {completed.returncode}: {completed.stderr.strip()[-1500:]}"
    return completed, ""


def cuda_tests() -> dict[str, Any]:
    """Counts of the ``cuda``-marked tests by outcome, and the names of those that failed."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        report = Path(folder) / "junit.xml"
        completed, problem = run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-m",
                "cuda",
                "-q",
                "-p",
                "no:cacheprovider",
                "--numprocesses",
                "0",
                f"--junitxml={report}",
                "tests",
            ],
            TESTS_S,
        )
        if not report.is_file():
            return {"error": problem or "pytest wrote no report"}
        cases = ElementTree.parse(report).getroot().iter("testcase")
        outcomes: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
        for case in cases:
            name = f"{case.get('classname')}::{case.get('name')}"
            kind = (
                "failed"
                if case.find("failure") is not None or case.find("error") is not None
                else "skipped"
                if case.find("skipped") is not None
                else "passed"
            )
            outcomes[kind].append(name)
    result: dict[str, Any] = {kind: len(names) for kind, names in outcomes.items()}
    result["failures"] = outcomes["failed"]
    if completed is not None and completed.returncode not in (0, 1):  # 1: some tests failed, listed above
        result["error"] = problem
    return result


def speed(arguments: list[str], limit: float) -> dict[str, Any]:
    """``speed.py --json`` with ``arguments``: its JSON object, or the error."""
    completed, problem = run([sys.executable, str(SPEED), "--json", *arguments], limit)
    if problem:
        return {"error": problem}
    return json.loads(completed.stdout)


def faithfulness_study(limit: float) -> dict[str, Any]:
    """``gpu_study.py --device cuda``: its JSON object, or the error."""
    completed, problem = run([sys.executable, str(STUDY), "--device", "cuda"], limit)
    if problem:
        return {"error": problem}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing was run")
        return 0
    start = time.perf_counter()
    results: dict[str, Any] = {"device_name": torch.cuda.get_device_name(0), "torch": torch.__version__}
    results["cuda_tests"] = cuda_tests()
    results["speed"] = speed(
        ["--device", "cuda", "--amp", "--repeats", "3", "--tutorial-repeats", "1"], SPEED_S
    )
    results["transformer"] = speed(
        ["--device", "cuda", "--parts", "transformer", "--repeats", "3", "--tutorial-repeats", "1"],
        TRANSFORMER_S,
    )
    results["scst_caption"] = speed(
        ["--device", "cuda", "--parts", "scst,caption", "--repeats", "3", "--tutorial-repeats", "1"],
        SCST_CAPTION_S,
    )
    results["study"] = faithfulness_study(STUDY_S)
    results["wall_s"] = time.perf_counter() - start
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
