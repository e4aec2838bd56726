"""Torch datasets and collate: shapes, padding, caption choice per epoch, bad images; and load_records."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from messages import raises_naming
from torchvision.transforms import functional as F

from captioning.config import CocoDataConfig, ConfigError, DataConfig, KarpathyDataConfig, ShapesDataConfig
from captioning.data import DATASETS, caption_length_summary, load_records
from captioning.data.datasets import CaptionDataset, ImageOnlyDataset, collate_captions
from captioning.data.images import ImageError
from captioning.data.karpathy import read_karpathy
from captioning.data.records import ImageRecord
from captioning.data.vocab import Vocabulary


def to_small_tensor(image) -> torch.Tensor:
    """PIL image -> (3, 16, 16) float tensor."""
    return F.to_tensor(image.resize((16, 16)))


@pytest.fixture
def records(karpathy_dataset) -> list[ImageRecord]:
    return read_karpathy(*karpathy_dataset)


@pytest.fixture
def vocab(records) -> Vocabulary:
    return Vocabulary.build((c for r in records for c in r.captions), min_count=1)


def _record(image_id: int, path: Path, captions: list[str]) -> ImageRecord:
    return ImageRecord(image_id, path, "train", tuple(tuple(c.split()) for c in captions), tuple(captions))


def test_caption_items_are_padded_start_end_sequences(records, vocab):
    dataset = CaptionDataset(records, vocab, max_length=4, captions_per_image=2, transform=to_small_tensor)
    item = dataset[1]  # "a cat sleeps on a sofa", "a cat on a couch"
    assert (item["index"], item["image_id"]) == (1, 25)
    assert item["image"].shape == (3, 16, 16) and item["image"].dtype == torch.float32
    assert item["captions"].shape == (2, 6) and item["captions"].dtype == torch.long
    assert item["lengths"].tolist() == [6, 6]  # 4 words kept + <start> + <end>
    assert vocab.decode(item["captions"][0]) == ["a", "cat", "sleeps", "on"]
    assert item["captions"][0, 0] == vocab.start_id and item["captions"][0, 5] == vocab.end_id


def test_short_captions_are_padded(tmp_path, make_image, vocab):
    record = _record(1, make_image(tmp_path / "a.jpg"), ["a dog", "a cat sleeps"])
    item = CaptionDataset([record], vocab, max_length=5, captions_per_image=2, transform=to_small_tensor)[0]
    assert item["lengths"].tolist() == [4, 5]
    assert item["captions"][0].tolist()[4:] == [vocab.pad_id] * 3


def test_caption_choice_covers_all_captions_over_epochs(tmp_path, vocab):
    seven = _record(1, tmp_path / "a.jpg", [f"caption {n}" for n in range(7)])
    two = _record(2, tmp_path / "b.jpg", ["one", "two"])
    dataset = CaptionDataset(
        [seven, two],
        vocab,
        max_length=5,
        captions_per_image=5,
        features=[np.zeros((4, 3), np.float32)] * 2,
        seed=1,
    )
    first = dataset.caption_choice(0)
    assert len(set(first.tolist())) == 5
    dataset.set_epoch(1)
    second = dataset.caption_choice(0)
    assert set(first.tolist()) | set(second.tolist()) == set(range(7))
    assert dataset.caption_choice(1).tolist() == [0, 1, 0, 1, 0]  # fewer captions: cycled
    again = CaptionDataset(
        [seven, two],
        vocab,
        max_length=5,
        captions_per_image=5,
        features=[np.zeros((4, 3), np.float32)] * 2,
        seed=1,
    )
    again.set_epoch(1)
    assert again.caption_choice(0).tolist() == second.tolist()  # a function of (seed, epoch, index)


def test_features_path_and_collate(records, vocab):
    grids = [np.full((6, 4), i, dtype=np.float16) for i in range(len(records))]
    dataset = CaptionDataset(records, vocab, max_length=20, captions_per_image=3, features=grids)
    batch = collate_captions([dataset[0], dataset[1], dataset[3]])
    assert batch["features"].shape == (3, 6, 4) and batch["features"].dtype == torch.float16  # as stored
    assert batch["features"][2, 0, 0] == 3
    assert batch["indices"].tolist() == [0, 1, 3]
    assert batch["image_ids"].tolist() == [9, 25, 42]
    assert batch["lengths"].shape == (3, 3)
    longest = int(batch["lengths"].max())
    assert batch["captions"].shape == (3, 3, longest)  # trimmed to the longest caption in the batch
    assert "images" not in batch


def test_unreadable_feature_rows_are_skipped(records, vocab):
    grids = [np.ones((6, 4), dtype=np.float16)] * len(records)
    dataset = CaptionDataset(
        records, vocab, max_length=5, features=grids, unreadable={2: "bad.jpg: truncated"}
    )
    assert dataset[2] is None and dataset.skipped == 1
    assert collate_captions([dataset[i] for i in range(4)])["indices"].tolist() == [0, 1, 3]


def test_features_must_be_grids(records, vocab):
    dataset = CaptionDataset(records, vocab, max_length=5, features=[np.zeros(8, np.float32)] * len(records))
    with pytest.raises(ValueError, match=r"\(P, C\)"):
        dataset[0]


def test_image_collate_and_image_only_dataset(records, vocab):
    dataset = CaptionDataset(records, vocab, 8, transform=to_small_tensor)
    batch = collate_captions([dataset[0], dataset[2]])
    assert batch["images"].shape == (2, 3, 16, 16)
    assert batch["captions"].shape[:2] == (2, 5)
    only = ImageOnlyDataset(records, to_small_tensor)
    assert len(only) == 5
    batch = collate_captions([only[i] for i in range(3)])
    assert set(batch) == {"indices", "image_ids", "images"}
    assert batch["images"].shape == (3, 3, 16, 16)


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGBA", "P"])
def test_any_image_mode_loads_as_rgb(tmp_path, make_image, vocab, mode):
    path = make_image(tmp_path / ("image.jpg" if mode in ("L", "CMYK") else "image.png"), mode=mode)
    item = CaptionDataset([_record(7, path, ["a dog"])], vocab, 5, transform=to_small_tensor)[0]
    assert item["image"].shape == (3, 16, 16)


def test_truncated_jpeg_is_an_error_or_skipped(tmp_path, make_image, vocab, caplog):
    good = make_image(tmp_path / "good.jpg", size=(64, 64))
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    records = [_record(1, good, ["a dog"]), _record(2, bad, ["a cat"])]
    with pytest.raises(ImageError, match=r"bad\.jpg \(image 2\)"):
        CaptionDataset(records, vocab, 5, transform=to_small_tensor)[1]
    dataset = CaptionDataset(records, vocab, 5, transform=to_small_tensor, skip_bad_images=True)
    with caplog.at_level(logging.WARNING):
        items = [dataset[0], dataset[1]]
    assert items[1] is None and dataset.skipped == 1
    assert "bad.jpg" in caplog.text
    assert collate_captions(items)["image_ids"].tolist() == [1]
    assert collate_captions([None]) is None


def test_missing_image_names_path_and_entry_at_load_time(karpathy_dataset, vocab):
    split_file, root = karpathy_dataset
    missing = root / "val2014" / "COCO_val2014_000000000042.jpg"
    missing.unlink()
    records = read_karpathy(split_file, root)  # reading does not touch the images
    dataset = CaptionDataset(records, vocab, 5, transform=to_small_tensor)
    with raises_naming(ImageError, f"{missing} (image 42)", "not found"):
        dataset[3]
    assert ImageOnlyDataset(records, to_small_tensor, skip_bad_images=True)[3] is None


def test_dataset_refuses_bad_arguments(tmp_path, records, vocab):
    with raises_naming(ValueError, "CaptionDataset", "features", "transform"):
        CaptionDataset(records, vocab, 5)
    with raises_naming(ValueError, "image_id 1", "caption", "ImageOnlyDataset"):
        CaptionDataset([ImageRecord(1, tmp_path / "a.jpg", "")], vocab, 5, transform=to_small_tensor)


# load_records and summaries -------------------------------------------------------------------------


def test_every_built_in_reader_is_registered():
    assert {"shapes", "karpathy", "coco", "imagefolder", "folder"} <= set(DATASETS.names())


def test_load_records_shapes_generates_then_reads(tmp_path):
    config = ShapesDataConfig(
        root=str(tmp_path / "shapes"),
        shapes_train=4,
        shapes_val=2,
        shapes_test=2,
        shapes_image_size=32,
        shapes_max_objects=2,
    )
    records = load_records(config, output_dir=tmp_path / "run")
    assert [r.split for r in records] == ["train"] * 4 + ["val"] * 2 + ["test"] * 2
    summary = json.loads((tmp_path / "run" / "data_summary.json").read_text())
    assert summary["splits"]["train"] == {"images": 4, "captions": 20}


def test_load_records_karpathy_coco_and_folder(karpathy_dataset, coco_dataset):
    split_file, root = karpathy_dataset
    karpathy = load_records(
        KarpathyDataConfig(root=str(root), split_file=str(split_file), restval_to_train=False)
    )
    assert [r.split for r in karpathy] == ["train", "train", "restval", "val", "test"]
    annotation_files, coco_root = coco_dataset
    coco = load_records(
        CocoDataConfig(root=str(coco_root), annotations=tuple(str(p) for p in annotation_files))
    )
    assert [r.image_id for r in coco] == [9, 25, 30, 42, 73]
    folder = load_records(DataConfig(dataset="folder", root=str(coco_root / "val2014")))
    assert [r.image_id for r in folder] == [1, 2, 3]


def test_load_records_needs_its_files(tmp_path):
    with pytest.raises(ConfigError, match="data.split_file"):
        load_records(KarpathyDataConfig(root=str(tmp_path)))
    with pytest.raises(ConfigError, match="data.annotations"):
        load_records(CocoDataConfig(root=str(tmp_path)))


def test_caption_length_summary(tmp_path):
    records = [
        _record(1, tmp_path / "a.jpg", ["a b c", "a b c d e"]),
        ImageRecord(2, tmp_path / "b.jpg", "test", (tuple("abcdefgh"),), ("",)),
    ]
    count, message = caption_length_summary(records, max_length=4)
    assert count == 1
    assert message == (
        "1 of 2 training captions (50.0%) exceed 4 words and are cut; 95% of them are at most 5 tokens: "
        "set data.max_caption_length=5 and decode.max_length=5 to keep them whole (docs/own-data.md)"
    )


def test_character_captions_that_are_cut_say_which_keys_to_raise(tmp_path):
    """Chinese captions by characters: 44% over 20 tokens; the summary names the keys and a length."""
    from captioning.data.tokenizers import tokenize_characters

    sentence = "一只棕色的小狗在绿色的草地上追着一个红色的球跑来跑去"  # 26 characters
    short = "一只狗在跑"
    captions = [tokenize_characters(sentence)] * 44 + [tokenize_characters(short)] * 56
    records = [
        ImageRecord(k, tmp_path / f"{k}.jpg", "train", (tuple(c),), ("",)) for k, c in enumerate(captions)
    ]
    count, message = caption_length_summary(records, max_length=20)
    assert count == 44 and message.startswith("44 of 100 training captions (44.0%) exceed 20 words")
    assert "data.max_caption_length=26" in message and "decode.max_length=26" in message  # the fix
    _, quiet = caption_length_summary(records, max_length=30)
    assert "set data" not in quiet
