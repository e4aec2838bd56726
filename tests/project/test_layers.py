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

REPOSITORY = Path(__file__).resolve().parents[2]
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
        ("utils/device.py", "captioning.training.engine"),  # the foundations reaching up into training
        ("hub/save.py", "captioning.api"),  # saved models reaching up into the Python API
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


def test_an_import_inside_a_function_counts_and_utils_may_not_import_the_configuration(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "captioning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPOSITORY / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "captioning" / "utils" / "files.py", "a", encoding="utf-8") as handle:
        handle.write("\n\ndef _late():\n    from captioning.config import Config\n\n    return Config\n")
    with open(tmp_path / "captioning" / "models" / "decoder.py", "a", encoding="utf-8") as handle:
        handle.write("\n\ndef _late():\n    from captioning.hub import checkpoint\n\n    return checkpoint\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Utilities stand on nothing of the configuration BROKEN" in result.stdout
    assert "captioning.utils.files -> captioning.config" in result.stdout
    assert "captioning.models.decoder -> captioning.hub" in result.stdout


def test_an_annotation_only_import_that_points_up_breaks_it_too(tmp_path):
    """``exclude_type_checking_imports = False``: an import under ``if TYPE_CHECKING:`` counts."""
    shutil.copytree(PACKAGE, tmp_path / "captioning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPOSITORY / ".importlinter", tmp_path / ".importlinter")
    with open(tmp_path / "captioning" / "models" / "decoder.py", "a", encoding="utf-8") as handle:
        handle.write("\nfrom typing import TYPE_CHECKING  # noqa: E402\n\nif TYPE_CHECKING:\n")
        handle.write("    from captioning.inference.captioner import Captioned  # noqa: F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "captioning.models.decoder -> captioning.inference.captioner" in result.stdout


def test_the_layers_are_few_and_the_package_top_holds_no_loose_module():
    """At most nine layers; beside the concept packages, only the front door and the registry pattern."""
    import configparser

    contract = configparser.ConfigParser()
    contract.read(REPOSITORY / ".importlinter")
    order = contract["importlinter:contract:layers"]["layers"]
    layers = [line for line in order.splitlines() if line.strip()]
    assert len(layers) <= 9, layers
    assert contract["importlinter"]["exclude_type_checking_imports"] == "False"
    loose = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "api.py", "registry.py"], loose
    packages = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
    named = {name.strip() for line in layers for name in line.replace("|", ":").split(":")}
    assert {f"captioning.{name}" for name in packages} <= named, (packages, named)
