"""The command-line tools run two ways: as a real subprocess, or in this process.

- ``run_tool(script, *args)``: ``python <script> args`` in a subprocess started in the repository, one
  intra-op thread. For what only a process shows: signals, locks held by another process, exit after
  a kill, ``ulimit``, a hanging ``java`` on ``PATH``, and each tool's end-to-end run from a shell.
- ``in_process(script, *args, cwd=None, timeout=None)``: what ``python <script> args`` does, in this
  process, through the same ``run_cli(main, get_args_parser(), argv)`` call the script makes: same
  exit status, same stdout and stderr, without the 3-4 s of imports and model build a new process pays. The
  run puts back what it changed for the whole process (``kept_process_state``), and so does the
  ``process_state`` fixture of conftest.py after every test.
- ``run_in_process(script, args)``: the same, as ``(exit status, stderr)``.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from captioning.cli.common import run_cli
from captioning.registry import registries

REPO = Path(__file__).resolve().parents[1]

# Tiny models gain nothing from intra-op threads, and on a busy machine they spin (10-30x slower). The
# same single thread in the tools and in this process also makes their features bit-identical.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_tool(
    script: str, *args, timeout: float = 300, cwd: Path = REPO, address_space: int | None = None
) -> subprocess.CompletedProcess:
    """The real command-line tool in a subprocess started in ``cwd``; with ``address_space``, under that
    real limit of its memory in bytes (``prlimit --as``), where an allocation past it fails."""
    limit = ["prlimit", f"--as={address_space}"] if address_space is not None else []
    return subprocess.run(
        [*limit, sys.executable, str(REPO / script), *map(str, args)],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ONE_THREAD,
    )


_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)


@contextmanager
def kept_registries() -> Iterator[None]:
    """Every registry as it was before the block (``Registry.scope``), and the modules imported in the
    block from the temporary folder (a user module a test wrote and a tool imported) forgotten with
    the entries they registered: nothing a test registers reaches another test's parameters."""
    modules = set(sys.modules)
    temporary = os.path.realpath(tempfile.gettempdir())
    with ExitStack() as stack:
        for registry in registries():
            stack.enter_context(registry.scope())
        try:
            yield
        finally:
            for name in set(sys.modules) - modules:
                file = getattr(sys.modules[name], "__file__", None) or ""
                if os.path.realpath(file).startswith(temporary + os.sep):
                    del sys.modules[name]


@contextmanager
def kept_process_state() -> Iterator[None]:
    """Puts back what a tool run in this process changes for the whole process: the random generators
    it seeds, torch's deterministic-algorithm and thread settings, signal handlers, the handlers on the
    package's logger and the current folder. (pytest itself restores warnings filters after each test,
    and manages the root logger's handlers.)"""
    folder = os.getcwd()
    generators = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cudnn_benchmark, threads = torch.backends.cudnn.benchmark, torch.get_num_threads()
    handlers = {number: signal.getsignal(number) for number in _HANDLED_SIGNALS}
    package_handlers = list(logging.getLogger("captioning").handlers)
    try:
        yield
    finally:
        os.chdir(folder)
        random.setstate(generators[0])
        np.random.set_state(generators[1])
        torch.set_rng_state(generators[2])
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark = cudnn_benchmark
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        for number, handler in handlers.items():
            signal.signal(number, handler)
        logging.getLogger("captioning").handlers[:] = package_handlers


_SCRIPTS: dict[str, ModuleType] = {}


def script_module(script: str) -> ModuleType:
    """``script`` imported once under its own module name (it runs nothing on import)."""
    if script not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"{Path(script).stem}_script", REPO / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[script] = module
    return _SCRIPTS[script]


def _out_of_time(signum: int, frame: object) -> None:
    raise TimeoutError("the tool did not finish in time (SIGALRM)")


def in_process(
    script: str, *args, cwd: Path | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """What ``python <script> args`` started in ``cwd`` does, run in this process: its exit status and
    what it printed on ``sys.stdout`` and ``sys.stderr``, as ``subprocess.run`` would give them.

    ``timeout``: a SIGALRM after that many seconds interrupts the run (even a blocking ``open`` of a
    FIFO); the tool then reports the ``TimeoutError`` as any failure, so a test that waits forever fails.
    """
    module = script_module(script)
    argv = [str(a) for a in args]
    stdout, stderr = io.StringIO(), io.StringIO()
    command_line = sys.argv
    sys.argv = [str(REPO / script), *argv]  # argparse names the program after it, as from a shell
    with kept_process_state(), redirect_stdout(stdout), redirect_stderr(stderr):
        if cwd is not None:
            os.chdir(cwd)
        if timeout is not None:
            signal.signal(signal.SIGALRM, _out_of_time)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            code = run_cli(module.main, module.get_args_parser(), argv)
        except SystemExit as stop:  # argparse refuses its own errors (exit status 2, usage on stderr)
            code = stop.code if isinstance(stop.code, int) else 1
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.argv = command_line
    return subprocess.CompletedProcess([script, *argv], code, stdout.getvalue(), stderr.getvalue())


def run_in_process(script: str, args: list) -> tuple[int, str]:
    """What ``python <script> args`` does, in this process: its exit status and stderr."""
    result = in_process(script, *args)
    return result.returncode, result.stderr
