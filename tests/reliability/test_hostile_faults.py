"""Faults name the file: a full disk, a read-only cache folder, a dataset without images, a checkpoint
holding a sparse tensor or an encoder this code does not have; and photos are read upright.

The tools run in this process (tests/tool_runs.py) against a real full tmpfs and a read-only mount.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image
from test_faults import assert_one_line_error, shapes
from test_hostile import short_run, small_disk, with_stored
from test_hostile_folders import read_only_mount
from tool_runs import REPO, in_process

from captioning.data.images import load_image

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["read_only_mount", "shapes", "small_disk"]  # fixtures of other test modules


def test_a_new_run_on_a_full_disk_names_the_file_and_leaves_nothing_behind(shapes, small_disk):
    with (small_disk / "filler").open("wb") as filler:
        filler.write(b"\0" * shutil.disk_usage(small_disk).free)
    result = in_process("train.py", "--no-test", *short_run(shapes, small_disk / "run"), cwd=REPO)
    line = assert_one_line_error(
        result.returncode, result.stderr, f"{small_disk / 'run'}/", "no space left on device", alone=False
    )
    assert "[Errno" not in line
    assert sorted(path.name for path in small_disk.iterdir()) == ["filler"]  # no run folder, no .train.lock


def test_a_read_only_cache_folder_is_named_before_any_image_is_encoded(
    shapes, tmp_path, read_only_mount, monkeypatch
):
    from captioning.data import cache_build

    def never(*args, **kwargs):
        raise AssertionError("rows were computed before the cache folder was checked")

    monkeypatch.setattr(cache_build.Build, "compute_share", never)
    result = in_process(
        "train.py",
        "--no-test",
        *short_run(shapes, tmp_path / "run", **{"data.cache_dir": read_only_mount / "cache"}),
        cwd=REPO,
    )
    assert_one_line_error(
        result.returncode,
        result.stderr,
        f"{read_only_mount}",
        "data.cache_dir: cannot write in",
        "(read-only file system)",
        alone=False,
    )


def test_a_split_file_without_images_is_named(shapes, tmp_path, write_json):
    split_file = write_json(tmp_path / "dataset_coco.json", {"images": [], "dataset": "coco"})
    result = in_process(
        "train.py",
        "--no-test",
        *short_run(
            shapes,
            tmp_path / "run",
            **{"data.dataset": "karpathy", "data.split_file": split_file, "data.root": tmp_path},
        ),
        cwd=REPO,
    )
    assert_one_line_error(result.returncode, result.stderr, str(split_file), "no images in split 'train'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda p: p["decoder"].update(
                {name: value.to_sparse() for name, value in list(p["decoder"].items())[:1]}
            ),
            "is a sparse_coo tensor; a checkpoint holds dense tensors",
        ),
        (
            lambda p: p["config"]["model"]["encoder"].update(name="resnet9000"),
            "stored model.encoder.name 'resnet9000' is not an encoder of this code",
        ),
    ],
    ids=["sparse-tensor", "unknown-encoder"],
)
def test_a_strange_checkpoint_is_named_in_one_short_line(shapes, tmp_path, edit, needle):
    checkpoint = with_stored(shapes.checkpoint, tmp_path / "odd.pt", edit)
    result = in_process(
        "evaluate.py", "--checkpoint", checkpoint, "--split", "test", "--no-java", cwd=tmp_path
    )
    line = assert_one_line_error(result.returncode, result.stderr, f"{checkpoint}: ", needle)
    assert len(line) < 400


def test_photos_are_read_upright_by_their_exif_orientation(tmp_path):
    upright = Image.new("RGB", (40, 30), (255, 0, 0))
    upright.paste((0, 0, 255), (20, 0, 40, 30))  # left red, right blue: any turn shows
    for orientation, stored in (
        (6, upright.transpose(Image.Transpose.ROTATE_90)),
        (3, upright.transpose(Image.Transpose.ROTATE_180)),
        (8, upright.transpose(Image.Transpose.ROTATE_270)),
    ):
        exif = Image.Exif()
        exif[0x0112] = orientation
        path = tmp_path / f"photo{orientation}.png"
        stored.save(path, exif=exif)
        assert np.array_equal(np.asarray(load_image(path)), np.asarray(upright)), orientation
