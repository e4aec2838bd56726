"""WebDataset tar shards (``data.dataset: webdataset``) in img2dataset's exact layout: the brace
pattern and the folder of shards, splits, every tokenizer, images read from a shard by member (cost
checks, undecodable ones), truncated shards and bad samples (one line naming the shard and the key,
or skipped and counted with ``data.skip_bad_images``), the feature cache keyed by shard and key, and
train.py, evaluate.py and visualize.py end to end on a tiny model.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from messages import raises_naming
from PIL import Image
from shard_fixture import COLOURS, jpeg, write_img2dataset

from captioning.config import ConfigError, DataConfig, EncoderConfig
from captioning.data import load_records, split_rule, tar_members
from captioning.data.datasets import CaptionDataset
from captioning.data.feature_cache import FeatureCache
from captioning.data.imagefolder import SPLIT_RULE
from captioning.data.images import ImageError, load_image
from captioning.data.records import DatasetError, ImageRecord
from captioning.data.shards import read_shards
from captioning.data.tokenizers import TOKENIZERS, tokenizer_for
from captioning.data.vocab import Vocabulary

pytest.importorskip("webdataset")


def _config(root: Path | str, **values) -> DataConfig:
    return DataConfig(dataset="webdataset", root=str(root), **values)


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    write_img2dataset(tmp_path / "shards")
    return tmp_path / "shards"


@pytest.fixture(autouse=True)
def _no_kept_listings():
    yield
    tar_members.forget_all()


# Reading shards


def test_a_brace_pattern_and_the_folder_read_the_same_records_beside_img2datasets_files(shards):
    assert sorted(p.name for p in shards.iterdir()) == [
        name for k in range(3) for name in (f"{k:05d}.parquet", f"{k:05d}.tar", f"{k:05d}_stats.json")
    ]
    by_pattern = load_records(_config(shards / "{00000..00002}.tar"))
    assert load_records(_config(shards)) == by_pattern
    assert len(by_pattern) == 24
    first = by_pattern[0]
    assert first.image_id == 0 and first.path == Path(f"{shards / '00000.tar'}#000000000.jpg")
    assert first.raw == ("A red picture.",) and first.captions == (("a", "red", "picture"),)
    # the keys' numbers (img2dataset's keys: shard then sample), and the image-folder reader's splits
    assert [r.image_id for r in by_pattern[7:10]] == [7, 10000, 10001]
    assert [r.split for r in by_pattern[:10]] == ["train"] * 8 + ["val", "test"]
    assert split_rule(_config(shards)) == SPLIT_RULE


def test_a_pattern_reads_the_shards_it_names_in_its_order(shards):
    records = load_records(_config(shards / "{00002,00001}.tar"))
    assert [r.image_id for r in records[:2]] == [20000, 20001] and len(records) == 16
    assert load_records(_config(shards / "00001.tar"))[0].image_id == 10000  # one shard is a pattern of one


def test_a_missing_shard_a_bad_pattern_or_nothing_at_root_is_one_line(shards, tmp_path):
    # the first missing shard, how many of the pattern's are missing, the pattern
    with raises_naming(DatasetError, shards / "00003.tar", "2 of the 5", f"{shards}/{{00000..00004}}.tar"):
        load_records(_config(shards / "{00000..00004}.tar"))
    # a relative pattern: also where it was looked for, and the key to set
    with raises_naming(
        DatasetError,
        Path("elsewhere/00000.tar"),
        "3 of the 3",
        "elsewhere/{00000..00002}.tar",
        Path.cwd(),
        "data.root=",
    ):
        load_records(_config("elsewhere/{00000..00002}.tar"))
    with raises_naming(ConfigError, f"{shards}/{{00000..00002.tar", "data.root", "brace"):
        load_records(_config(shards / "{00000..00002.tar"))
    with raises_naming(ConfigError, tmp_path / "elsewhere", "data.root="):
        load_records(_config(tmp_path / "elsewhere"))
    (tmp_path / "empty").mkdir()
    with raises_naming(DatasetError, tmp_path / "empty", ".tar"):
        load_records(_config(tmp_path / "empty"))
    with raises_naming(ConfigError, "https://example.com/{00000..00002}.tar", "data.root", "local"):
        load_records(_config("https://example.com/{00000..00002}.tar"))


def test_without_the_library_the_error_names_the_extra(shards, monkeypatch):
    monkeypatch.setitem(sys.modules, "webdataset", None)
    monkeypatch.setitem(sys.modules, "webdataset.tariterators", None)
    with raises_naming(ConfigError, "data.dataset=webdataset", 'pip install -e ".[webdataset]"'):
        load_records(_config(shards))


def test_captions_come_from_json_captions_then_txt_then_json_caption(tmp_path):
    def edit(number: int, sample: dict) -> None:
        meta = json.loads(sample["json"])
        if number == 0:
            meta["captions"] = ["First of two.", "Second of two."]
        if number == 1:
            del sample["txt"]
            meta["caption"] = "Only in the json."
        sample["json"] = json.dumps(meta)
        if number == 2:
            del sample["json"]

    write_img2dataset(tmp_path / "shards", shards=1, per_shard=3, edit=edit)
    records = read_shards(tmp_path / "shards")
    assert [r.raw for r in records] == [
        ("First of two.", "Second of two."),
        ("Only in the json.",),
        ("A blue picture.",),
    ]


@pytest.mark.parametrize("tokenizer", TOKENIZERS.names())
def test_every_tokenizer_makes_the_training_tokens(tmp_path, tokenizer):
    captions = ["一只红色的狗在草地上跑。", "Một con_chó đang chạy .", "赤い犬が走っている。"]
    write_img2dataset(tmp_path / "shards", shards=1, per_shard=3, caption=lambda n: captions[n])
    records = load_records(_config(tmp_path / "shards", tokenizer=tokenizer))
    tokenize = tokenizer_for(tokenizer)
    assert [r.captions for r in records] == [(tuple(tokenize(caption)),) for caption in captions]
    assert [r.raw for r in records] == [(caption,) for caption in captions]


def test_splits_json_beside_the_shards_gives_each_shard_its_split(shards):
    (shards / "splits.json").write_text(
        json.dumps({"train": ["{00000..00001}.tar"], "validation": "00002.tar", "test": []}), encoding="utf-8"
    )
    records = load_records(_config(shards / "{00000..00002}.tar"))
    assert [r.split for r in records] == ["train"] * 16 + ["val"] * 8
    assert split_rule(_config(shards)) is None
    # a pattern naming fewer shards than splits.json lists reads those
    assert {r.split for r in load_records(_config(shards / "00002.tar"))} == {"val"}

    (shards / "splits.json").write_text(json.dumps({"train": ["00000.tar"], "test": ["00002.tar"]}))
    with raises_naming(DatasetError, shards / "00001.tar", shards / "splits.json", "train, test"):
        load_records(_config(shards))
    (shards / "splits.json").write_text(json.dumps({"train": ["00000.tar"], "holdout": []}))
    with raises_naming(DatasetError, shards / "splits.json", "'holdout'", "train, val"):
        load_records(_config(shards))
    (shards / "splits.json").write_text(json.dumps({"train": ["{00000..00002}.tar"], "test": ["00002.tar"]}))
    with raises_naming(DatasetError, shards / "splits.json", "00002.tar", "'train'", "'test'"):
        load_records(_config(shards))


# Bad samples and truncated shards


def _drop(number: int, *kinds: str):
    def edit(at: int, sample: dict) -> None:
        if at == number:
            for kind in kinds:
                del sample[kind]

    return edit


@pytest.mark.parametrize(
    ("kinds", "names", "reason"),
    [
        (("txt", "json"), ("caption", "txt", "json"), "samples without a caption"),
        (("jpg",), ("image", "jpg, jpeg, png, webp"), "samples without an image"),
    ],
)
def test_a_sample_without_its_caption_or_image_names_the_shard_and_the_key(
    tmp_path, caplog, kinds, names, reason
):
    tars = write_img2dataset(tmp_path / "shards", edit=_drop(10, *kinds))  # shard 1, its 3rd sample
    with raises_naming(DatasetError, f"{tars[1]}: key '000010002'", *names, "data.skip_bad_images=true"):
        load_records(_config(tmp_path / "shards"))
    with caplog.at_level(logging.WARNING, logger="captioning.data.shards"):
        records = load_records(_config(tmp_path / "shards", skip_bad_images=True))
    assert len(records) == 23 and 10002 not in {r.image_id for r in records}
    assert f"skipped 1 {reason} (first: {tars[1]}: key '000010002')" in caplog.text


def test_a_caption_without_words_or_a_bad_json_names_the_shard_and_the_key(tmp_path):
    def edit(number: int, sample: dict) -> None:
        if number == 4:
            sample["txt"] = "..."
        if number == 5:
            sample["json"] = "{not json"

    tars = write_img2dataset(tmp_path / "shards", shards=1, edit=edit)
    with raises_naming(DatasetError, f"{tars[0]}: key '000000004'", "'...'"):
        load_records(_config(tars[0]))
    records = load_records(_config(tars[0], skip_bad_images=True))
    assert [r.image_id for r in records] == [0, 1, 2, 3, 6, 7]


def _member(tar: Path, name: str) -> tarfile.TarInfo:
    with tarfile.open(tar) as archive:
        return archive.getmember(name)


def test_a_truncated_shard_is_one_line_naming_it_and_the_key_or_its_start_is_read(tmp_path, caplog):
    tars = write_img2dataset(tmp_path / "shards")
    cut = _member(tars[1], "000010005.jpg")
    with open(tars[1], "r+b") as handle:  # a partial download: the file ends inside an image
        handle.truncate(cut.offset_data + cut.size // 2)
    with raises_naming(
        DatasetError, tars[1], "truncated", "key '000010005'", "'000010005.jpg'", "data.skip_bad_images=true"
    ):
        load_records(_config(tmp_path / "shards"))
    with caplog.at_level(logging.WARNING, logger="captioning.data.shards"):
        records = load_records(_config(tmp_path / "shards", skip_bad_images=True))
    assert [r.image_id for r in records if 10000 <= r.image_id < 20000] == [10000, 10001, 10002, 10003, 10004]
    assert len(records) == 21 and "skipped 1 truncated shards" in caplog.text


def test_a_shard_cut_between_members_or_not_a_tar_is_named(tmp_path):
    tars = write_img2dataset(tmp_path / "shards")
    header = _member(tars[2], "000020003.jpg").offset
    with open(tars[2], "r+b") as handle:  # cut at a header: tarfile alone would stop quietly
        handle.truncate(header)
    with raises_naming(DatasetError, tars[2], "truncated", "'000020002.txt'", "data.skip_bad_images=true"):
        load_records(_config(tmp_path / "shards"))
    assert len(load_records(_config(tmp_path / "shards", skip_bad_images=True))) == 16 + 3
    tars[0].write_bytes(b"<html>Not found</html>")
    with raises_naming(DatasetError, tars[0], "tar"):
        load_records(_config(tmp_path / "shards"))


# Images read from the shards


def test_images_are_read_from_their_shard_in_any_process_and_checked_as_files(tmp_path):
    def edit(number: int, sample: dict) -> None:
        if number == 2:
            sample["jpg"] = b"not a JPEG at all"
        if number == 3:
            del sample["jpg"]
            buffer = io.BytesIO()
            Image.new("1", (1, 40_000)).save(buffer, "PNG")  # a few hundred bytes, refused from its header
            sample["png"] = buffer.getvalue()

    tars = write_img2dataset(tmp_path / "shards", shards=1, edit=edit)
    records = load_records(_config(tars[0]))
    assert records[3].path.name == "00000.tar#000000003.png"
    picture = load_image(records[1].path, "image 1")
    assert picture.size == (48, 40) and picture.getpixel((24, 20)) == pytest.approx(COLOURS[1], abs=8)
    tar_members.forget_all()  # a process that did not read the shards (a spawned worker) lists them first
    assert np.array_equal(np.asarray(load_image(records[1].path)), np.asarray(picture))
    # the archive's member, the entry, what is wrong with it
    with raises_naming(ImageError, f"{tars[0]}#000000002.jpg (image 2)", "PIL"):
        load_image(records[2].path, "image 2")
    with raises_naming(ImageError, f"{tars[0]}#000000003.png (image 3)", "1x40000", "30000"):
        load_image(records[3].path, "image 3")
    missing = Path(f"{tars[0]}#000000099.jpg")
    with raises_naming(ImageError, missing, "'000000099.jpg'"):
        load_image(missing)
    assert tar_members.image_exists(records[0].path) and not tar_members.image_exists(missing)

    vocab = Vocabulary.build([c for r in records for c in r.captions], 1)
    dataset = CaptionDataset(
        records, vocab, 10, captions_per_image=1, transform=lambda image: image, skip_bad_images=True
    )
    assert [dataset[k] is None for k in range(4)] == [False, False, True, True] and dataset.skipped == 2


def test_a_rewritten_shard_is_listed_again(tmp_path):
    tars = write_img2dataset(tmp_path / "shards", shards=1, per_shard=3)
    records = load_records(_config(tars[0]))
    assert load_image(records[2].path).getpixel((0, 0)) == pytest.approx(COLOURS[2], abs=8)
    # the same keys with longer images: every member moves
    write_img2dataset(
        tmp_path / "shards", shards=1, per_shard=3, edit=lambda n, s: s.update(jpg=jpeg(COLOURS[5], (90, 70)))
    )
    assert load_image(records[2].path).size == (90, 70)


# The feature cache


def test_the_feature_cache_keys_rows_by_shard_and_key_and_matches_the_same_images_as_files(tmp_path):
    from captioning.models.encoders import build_encoder

    encoder = build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=2)
    )
    tars = write_img2dataset(tmp_path / "shards", shards=2, per_shard=4)
    records = load_records(_config(tmp_path / "shards"))

    def build(records: list[ImageRecord], **kwargs) -> FeatureCache:
        return FeatureCache.build_or_open(
            tmp_path / "cache", encoder, records, batch_size=3, progress=False, **kwargs
        )

    cache = build(records)
    assert cache.computed == 8
    index = json.loads((cache.path / "index.json").read_text())
    assert sorted(index["files"]) == sorted(str(Path(r.path).absolute()) for r in records)
    assert f"{tars[1].absolute()}#000010002.jpg" in index["files"]
    grids = np.stack([cache[k] for k in range(8)])
    tar_members.forget_all()
    again = build(records)
    assert again.computed == 0 and np.array_equal(np.stack([again[k] for k in range(8)]), grids)

    # The same images extracted to files: the same rows (same ids, same bytes), nothing computed.
    folder = tmp_path / "files"
    folder.mkdir()
    as_files = []
    for record in records:
        path = folder / f"{record.image_id}.jpg"
        path.write_bytes(tar_members.read_member(tar_members.locate(record.path)[0]))
        as_files.append(ImageRecord(record.image_id, path, record.split, record.captions, record.raw))
    from_files = build(as_files)
    assert from_files.computed == 0 and np.array_equal(np.stack([from_files[k] for k in range(8)]), grids)

    # A shard rewritten with one image changed: only that row is computed again.
    write_img2dataset(
        tmp_path / "shards",
        shards=2,
        per_shard=4,
        edit=lambda n, s: s.update(jpg=jpeg((9, 9, 9))) if n == 6 else None,
    )
    records = load_records(_config(tmp_path / "shards"))
    assert build(records).computed == 1


def test_an_undecodable_image_is_recorded_by_the_cache_with_skip_bad_images(tmp_path):
    from captioning.models.encoders import build_encoder

    encoder = build_encoder(
        EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64, grid_size=2)
    )
    tars = write_img2dataset(
        tmp_path / "shards",
        shards=1,
        per_shard=4,
        edit=lambda n, s: s.update(jpg=s["jpg"][: len(s["jpg"]) // 2]) if n == 1 else None,
    )
    records = load_records(_config(tars[0]))
    with raises_naming(ImageError, f"{tars[0]}#000000001.jpg (image 1)", "decode"):
        FeatureCache.build_or_open(tmp_path / "cache", encoder, records, batch_size=4, progress=False)
    cache = FeatureCache.build_or_open(
        tmp_path / "cache", encoder, records, batch_size=4, progress=False, skip_bad_images=True
    )
    assert list(cache.bad) == [1] and "00000.tar#000000001.jpg" in cache.bad[1]


# The three tools end to end

TINY = {
    "model.encoder.weights": "none",
    "model.encoder.image_size": 64,
    "model.decoder.embed_dim": 16,
    "model.decoder.hidden_dim": 32,
    "model.decoder.attention_dim": 16,
    "train.epochs": 1,
    "train.batch_size": 4,
    "decode.beam_size": 2,
    "decode.batch_size": 8,
    "decode.max_length": 12,
}


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_img2dataset_shards_train_evaluate_and_visualise_with_cached_features(tmp_path):
    from tool_runs import REPO, in_process

    write_img2dataset(tmp_path / "shards")
    settings = {**TINY, "data.dataset": "webdataset", "data.root": "shards/{00000..00002}.tar"}
    flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    config = ["--config", REPO / "configs" / "imagefolder.yaml", *flags]

    def tool(script: str, *args):
        result = in_process(script, "--no-progress", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    trained = tool("train.py", *config, "--set", "train.output_dir=run")
    assert (
        f"images: train 20, val 2 (validating on 2), test 2 (scored at the end); {SPLIT_RULE};"
        in trained.stdout
    )
    run = tmp_path / "run"
    for name in (
        "checkpoints/best.pt",
        "data_summary.json",
        "test_results.json",
        "test_scores.json",
        "report.html",
    ):
        assert (run / name).is_file(), name
    assert json.loads((run / "data_summary.json").read_text())["split_rule"] == SPLIT_RULE
    tested = sorted(r["image_id"] for r in json.loads((run / "test_results.json").read_text()))
    assert tested == [10001, 20003]  # the 10th of every 10 in reading order, ids from the keys
    assert "00001.tar#000010001.jpg" in (run / "report.html").read_text(encoding="utf-8")

    # The grids were cached beside the shards, keyed by shard and key: a second pass computes nothing.
    # The shards' listings are kept there too (tests/data/test_shard_listings.py).
    features = tmp_path / "shards" / "features"
    assert len(list((features / "shard_listings").glob("0000?-*.json"))) == 3
    (cache,) = (path for path in features.iterdir() if path.name != "shard_listings")
    files = json.loads((cache / "index.json").read_text())["files"]
    assert len(files) == 24 and all("#" in name for name in files)
    again = tool("train.py", *config, "--set", "train.output_dir=cached", "--cache-only")
    for split in ("train", "val", "test"):
        assert (
            f"{split} features: already cached in {Path('shards') / 'features' / cache.name}" in again.stdout
        )

    checkpoint = run / "checkpoints" / "best.pt"
    tool("evaluate.py", "--checkpoint", checkpoint, "--split", "test", "--no-java")
    scores = json.loads((run / "eval_best_test_scores.json").read_text())
    assert scores["images"] == 2 and scores["CIDEr-D"] is not None
    tool(
        "visualize.py",
        "--checkpoint",
        checkpoint,
        "--split",
        "test",
        "--num",
        "2",
        "--out-dir",
        tmp_path / "figures",
    )
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == ["10001.png", "20003.png"]
