"""A dataset reader's options are its own: ``DataConfig`` holds what every reader shares, the Shapes
generator's ``data.shapes_*`` options are ``ShapesDataConfig``'s, chosen by ``data.dataset: shapes``,
under the names every run folder, checkpoint and model folder has stored them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from captioning.config import (
    DATASETS,
    Config,
    ConfigError,
    DataConfig,
    LSTMDecoderConfig,
    ModelConfig,
    ShapesDataConfig,
    to_dict,
)
from captioning.config.loading import (
    CHECKPOINT_SECTIONS,
    apply_overrides,
    from_dict,
    load_config,
    parse_overrides,
    save_config,
)
from captioning.data.vocab import SPECIALS, Vocabulary
from captioning.hub.checkpoint import checkpoint_config, load_checkpoint, save_checkpoint
from captioning.models.decoder import ShowAttendTellDecoder

SHAPES_OPTIONS = {
    "shapes_seed",
    "shapes_train",
    "shapes_val",
    "shapes_test",
    "shapes_image_size",
    "shapes_max_objects",
}
SMALL_SHAPES = ShapesDataConfig(root="elsewhere", shapes_seed=3, shapes_train=12, shapes_image_size=64)


def _names(cls: type) -> set[str]:
    return {item.name for item in dataclasses.fields(cls)}


def test_the_shared_data_section_holds_no_option_of_the_shapes_generator():
    assert not any(name.startswith("shapes") for name in _names(DataConfig))
    assert _names(ShapesDataConfig) - _names(DataConfig) == SHAPES_OPTIONS
    assert DATASETS["shapes"].config is ShapesDataConfig
    assert type(Config().data) is ShapesDataConfig  # the demo's default
    assert type(from_dict({"data": {"dataset": "karpathy"}}).data) is DataConfig


def test_the_section_class_must_be_the_one_its_dataset_chooses():
    with pytest.raises(
        ConfigError, match="data.dataset 'shapes' is configured by ShapesDataConfig, not DataConfig"
    ):
        DataConfig(dataset="shapes")
    with pytest.raises(
        ConfigError, match="data.dataset 'coco' is configured by DataConfig, not ShapesDataConfig"
    ):
        ShapesDataConfig(dataset="coco")
    with pytest.raises(ConfigError, match="data.shapes_image_size must be >= 32"):
        ShapesDataConfig(shapes_image_size=16)


def test_a_shapes_configuration_round_trips_through_yaml(tmp_path):
    config = Config(data=SMALL_SHAPES)
    path = tmp_path / "config.yaml"
    save_config(config, path)
    written = yaml.safe_load(path.read_text(encoding="utf-8"))["data"]
    assert written["dataset"] == "shapes" and written["shapes_train"] == 12 and written["shapes_seed"] == 3
    assert load_config(path) == config
    path.write_text("data:\n  dataset: shapes\n  shapes_train: 30\n  shapes_seed: 7\n", encoding="utf-8")
    assert load_config(path).data == ShapesDataConfig(shapes_train=30, shapes_seed=7)


def test_a_shapes_configuration_takes_set_overrides_under_the_names_users_type():
    overrides = parse_overrides(["data.shapes_train=200", "data.shapes_max_objects=2"])
    config = load_config(None, overrides)
    assert type(config.data) is ShapesDataConfig
    assert (config.data.shapes_train, config.data.shapes_max_objects) == (200, 2)
    assert apply_overrides(config, {"data.shapes_val": "9"}, CHECKPOINT_SECTIONS).data.shapes_val == 9


def test_a_shapes_configuration_round_trips_through_a_checkpoint(tmp_path):
    decoder_config = LSTMDecoderConfig(embed_dim=8, hidden_dim=8, attention_dim=8, num_heads=2)
    config = Config(data=SMALL_SHAPES, model=ModelConfig(decoder=decoder_config))
    vocab = Vocabulary([*SPECIALS, "a", "circle"])
    torch.manual_seed(0)
    decoder = ShowAttendTellDecoder.from_config(decoder_config, len(vocab), 4)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, config=config, vocab=vocab, decoder_state=decoder.state_dict())
    payload = load_checkpoint(path)
    assert payload["config"]["data"] == to_dict(SMALL_SHAPES)  # the keys every checkpoint has stored
    assert {*payload["config"]["data"]} >= SHAPES_OPTIONS
    stored, _ = checkpoint_config(payload, path)
    assert stored == config and type(stored.data) is ShapesDataConfig


def test_a_stored_data_section_of_another_dataset_leaves_the_shapes_options_out():
    # Every run's data section held the Shapes options before they moved, whatever its dataset.
    older = {**to_dict(ShapesDataConfig()), "dataset": "karpathy", "split_file": "dataset_coco.json"}
    data = from_dict({"data": older}, stored=True).data
    assert type(data) is DataConfig and data.split_file == "dataset_coco.json"
    with pytest.raises(ConfigError, match=r"data\.shapes_\w+ is an option of the shapes dataset reader"):
        from_dict({"data": older})  # a user's file is read strictly


@pytest.mark.parametrize("dataset", ["karpathy", "coco", "my_own_reader"])
def test_a_shapes_option_with_another_dataset_is_refused_in_one_line_naming_both(dataset):
    overrides = {"data.dataset": dataset, "data.shapes_train": "5"}
    expected = f"data.shapes_train is an option of the shapes dataset reader, not of data.dataset {dataset!r}"
    for read in (
        lambda: load_config(None, overrides),
        lambda: apply_overrides(Config(), overrides, CHECKPOINT_SECTIONS),
        lambda: from_dict({"data": {"dataset": dataset, "shapes_train": 5}}),
    ):
        with pytest.raises(ConfigError) as raised:
            read()
        assert str(raised.value) == expected


def test_train_py_refuses_a_shapes_option_with_another_dataset_before_any_work(tmp_path):
    from tool_runs import in_process

    result = in_process(
        "train.py",
        "--set",
        "data.dataset=karpathy",
        "--set",
        "data.shapes_train=5",
        "--output-dir",
        tmp_path / "run",
        cwd=tmp_path,
    )
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    # The default file's other Shapes options are left out without a word: the user named no file.
    assert result.stderr.strip().splitlines() == [
        "error: data.shapes_train is an option of the shapes dataset reader, not of data.dataset 'karpathy'"
    ]


def test_another_dataset_set_over_a_shapes_file_or_checkpoint_leaves_the_shapes_options_out(tmp_path, caplog):
    path = tmp_path / "shapes.yaml"
    path.write_text("data:\n  dataset: shapes\n  shapes_train: 30\n  min_word_count: 1\n", encoding="utf-8")
    config = load_config(path, {"data.dataset": "karpathy", "data.split_file": "split.json"})
    assert config.data == DataConfig(dataset="karpathy", split_file="split.json", min_word_count=1)
    assert "left out (shapes_train); kept: min_word_count" in caplog.text
    # evaluate.py --set data.dataset=... over a Shapes checkpoint's configuration
    moved = apply_overrides(Config(data=SMALL_SHAPES), {"data.dataset": "folder"}, CHECKPOINT_SECTIONS)
    assert moved.data == DataConfig(dataset="folder", root="elsewhere")
