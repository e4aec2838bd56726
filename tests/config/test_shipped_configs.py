"""The shipped configurations are package data: ``--config configs/<name>.yaml`` works from any
folder and from a non-editable install, where no ``configs/`` folder sits beside the user."""

from __future__ import annotations

import configparser
from pathlib import Path

from tool_runs import REPO, in_process

from captioning.cli.common import SHIPPED_CONFIGS, shipped_config


def test_the_configurations_live_in_the_package_and_the_root_folder_links_to_them():
    assert SHIPPED_CONFIGS.is_dir() and SHIPPED_CONFIGS.parent.name == "captioning"
    assert (REPO / "configs").resolve() == SHIPPED_CONFIGS.resolve()
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    package_data = setup["options.package_data"]
    assert "configs/*.yaml" in package_data["captioning"]
    assert "templates/*" in package_data["captioning.visualization"]


def test_a_documented_config_path_is_found_from_another_folder(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped_config("configs/coco_resnet101.yaml") == SHIPPED_CONFIGS / "coco_resnet101.yaml"
    assert shipped_config("coco_resnet101.yaml") == SHIPPED_CONFIGS / "coco_resnet101.yaml"
    assert shipped_config("configs/no_such.yaml") == Path("configs/no_such.yaml")  # refused later, as given
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "coco_resnet101.yaml").write_text("train:\n  epochs: 3\n")
    assert shipped_config("configs/coco_resnet101.yaml") == Path("configs/coco_resnet101.yaml")  # yours wins


def test_train_py_reads_a_shipped_config_from_another_folder(tmp_path: Path):
    # train.epochs=-1 is refused after the configuration was read: the file was found.
    run = in_process("train.py", "--config", "configs/shapes.yaml", "--set", "train.epochs=-1", cwd=tmp_path)
    assert run.returncode == 2
    assert "train.epochs" in run.stderr and "no such file" not in run.stderr.lower()
