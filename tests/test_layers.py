"""The package's layer order (``.importlinter``, docs/architecture.md) holds, and an import that
points up breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import captioning

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = Path(captioning.__file__).resolve().parent


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the package found under ``root`` with ``root``'s contract (no cache written)."""
    script = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    environment = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", script, str(root / ".importlinter"), "--no-cache"],
        check=False,
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_its_layer_order():
    result = lint_imports(REPOSITORY)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Layers point down KEPT" in result.stdout


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("runtime/device.py", "captioning.training.engine"),  # the run machinery reaching up into training
        ("data/feature_cache.py", "captioning.models.encoders"),  # data reaching up into the models
        ("training/engine.py", "captioning.visualization.overlay"),  # between independent siblings
    ],
)
def test_an_import_that_points_up_breaks_the_contract(tmp_path, importer, imported):
    shutil.copytree(PACKAGE, tmp_path / "captioning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPOSITORY / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "captioning" / importer, "a", encoding="utf-8") as handle:
        handle.write(f"\nimport {imported}  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Layers point down BROKEN" in result.stdout
    importer_module = "captioning." + importer.removesuffix(".py").replace("/", ".")
    assert f"{importer_module} -> {imported}" in result.stdout
