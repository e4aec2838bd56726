"""A dataset reader's options are its own: ``DataConfig`` holds what every reader shares, the Shapes
generator's ``data.shapes_*`` options are ``ShapesDataConfig``'s, chosen by ``data.dataset: shapes``,
Karpathy's split file (``data.split_file``, ``data.restval_to_train``) the karpathy and coco readers'
(``KarpathyDataConfig``, ``CocoDataConfig``, from one base) and the COCO caption files
(``data.annotations``) the coco reader's, under the names every run folder, checkpoint and model
folder has stored them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from messages import raises_naming
from test_faults import assert_one_line_error

from captioning.config import (
    DATASETS,
    CocoDataConfig,
    Config,
    ConfigError,
    DataConfig,
    KarpathyDataConfig,
    KarpathySplitConfig,
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
    assert type(from_dict({"data": {"dataset": "karpathy"}}).data) is KarpathyDataConfig
    assert type(from_dict({"data": {"dataset": "folder"}}).data) is DataConfig


def test_the_section_class_must_be_the_one_its_dataset_chooses():
    with raises_naming(ConfigError, "data.dataset 'shapes'", "ShapesDataConfig", "DataConfig"):
        DataConfig(dataset="shapes")
    with raises_naming(ConfigError, "data.dataset 'coco'", "CocoDataConfig", "ShapesDataConfig"):
        ShapesDataConfig(dataset="coco")
    with raises_naming(ConfigError, "data.shapes_image_size", "32"):
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
    assert type(data) is KarpathyDataConfig and data.split_file == "dataset_coco.json"
    with raises_naming(ConfigError, "data.shapes_", "shapes", "data.dataset 'karpathy'"):
        from_dict({"data": older})  # a user's file is read strictly


@pytest.mark.parametrize("dataset", ["karpathy", "coco", "my_own_reader"])
def test_a_shapes_option_with_another_dataset_is_refused_in_one_line_naming_both(dataset):
    overrides = {"data.dataset": dataset, "data.shapes_train": "5"}
    # the option, its reader, the dataset set; for an unknown reader, the flag that registers one
    names = ("data.shapes_train", "shapes", f"data.dataset {dataset!r}")
    if dataset == "my_own_reader":
        names += ("--import",)
    for read in (
        lambda: load_config(None, overrides),
        lambda: apply_overrides(Config(), overrides, CHECKPOINT_SECTIONS),
        lambda: from_dict({"data": {"dataset": dataset, "shapes_train": 5}}),
    ):
        with raises_naming(ConfigError, *names) as raised:
            read()
        assert ("--import" in str(raised.value)) == (dataset == "my_own_reader")


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
    assert not (tmp_path / "run").exists()
    # The default file's other Shapes options are left out without a word: the user named no file.
    assert_one_line_error(
        result.returncode, result.stderr, "data.shapes_train", "shapes", "data.dataset 'karpathy'"
    )


def test_another_dataset_set_over_a_shapes_file_or_checkpoint_leaves_the_shapes_options_out(tmp_path, caplog):
    path = tmp_path / "shapes.yaml"
    path.write_text("data:\n  dataset: shapes\n  shapes_train: 30\n  min_word_count: 1\n", encoding="utf-8")
    config = load_config(path, {"data.dataset": "karpathy", "data.split_file": "split.json"})
    assert config.data == KarpathyDataConfig(split_file="split.json", min_word_count=1)
    assert "left out (shapes_train); kept: min_word_count" in caplog.text
    # evaluate.py --set data.dataset=... over a Shapes checkpoint's configuration
    moved = apply_overrides(Config(data=SMALL_SHAPES), {"data.dataset": "folder"}, CHECKPOINT_SECTIONS)
    assert moved.data == DataConfig(dataset="folder", root="elsewhere")


KARPATHY_OPTIONS = {"split_file", "restval_to_train"}
COCO_OPTIONS = {"annotations", *KARPATHY_OPTIONS}


def test_the_shared_data_section_holds_no_option_of_the_karpathy_or_coco_reader():
    assert not _names(DataConfig) & COCO_OPTIONS
    assert "instances" in _names(DataConfig)  # boxes for grounding, whatever the dataset
    assert _names(KarpathyDataConfig) - _names(DataConfig) == KARPATHY_OPTIONS
    assert _names(CocoDataConfig) - _names(DataConfig) == COCO_OPTIONS
    # Siblings from one base: a coco configuration is not a karpathy one.
    assert issubclass(CocoDataConfig, KarpathySplitConfig) and not issubclass(
        CocoDataConfig, KarpathyDataConfig
    )
    assert DATASETS["karpathy"].config is KarpathyDataConfig and DATASETS["coco"].config is CocoDataConfig
    assert "KarpathySplitConfig" not in {family.config.__name__ for _, family in DATASETS.items()}
    with pytest.raises(TypeError):
        DataConfig(dataset="folder", split_file="x.json")  # type: ignore[call-arg]
    with raises_naming(ConfigError, "data.dataset 'karpathy'", "KarpathyDataConfig"):
        DataConfig(dataset="karpathy")
    with raises_naming(ConfigError, "data.dataset 'coco'", "CocoDataConfig"):
        KarpathyDataConfig(dataset="coco")
    with raises_naming(ConfigError, "data.restval_to_train", "'no'"):
        KarpathyDataConfig(restval_to_train="no")  # type: ignore[arg-type]


def test_the_karpathy_and_coco_readers_take_their_own_options_class():
    from captioning.data.coco import CocoReader
    from captioning.data.karpathy import KarpathyReader

    assert DATASETS["karpathy"].implementation is KarpathyReader
    assert DATASETS["coco"].implementation is CocoReader
    karpathy = load_config(None, {"data.dataset": "karpathy", "data.split_file": "split.json"}).data
    assert karpathy == KarpathyDataConfig(split_file="split.json")
    coco = load_config(None, {"data.dataset": "coco", "data.annotations": "a.json,b.json"}).data
    assert coco == CocoDataConfig(annotations=("a.json", "b.json")) and coco.split_file is None
    assert KarpathyReader().source_files(karpathy) == [Path("split.json")]
    assert CocoReader().source_files(coco) == [Path("a.json"), Path("b.json")]
    # Their own option beside the files keys their record index; the files' names do not (their
    # contents do), and a reader without options of its own has none.
    assert KarpathyReader().index_options(karpathy) == {"restval_to_train": True}
    assert CocoReader().index_options(dataclasses.replace(coco, restval_to_train=False)) == {
        "restval_to_train": False
    }
    assert DATASETS["folder"].implementation().index_options(DataConfig(dataset="folder")) == {}


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            {"data.dataset": "folder", "data.split_file": "x.json"},
            ("data.split_file", "karpathy", "coco", "data.dataset 'folder'"),
        ),
        (
            {"data.restval_to_train": "false"},  # the default dataset, shapes
            ("data.restval_to_train", "karpathy", "coco", "data.dataset 'shapes'"),
        ),
        (
            {"data.dataset": "karpathy", "data.split_file": "x.json", "data.annotations": "a.json"},
            ("data.annotations", "coco", "data.dataset 'karpathy'"),
        ),
    ],
)
def test_an_option_of_the_karpathy_or_coco_reader_elsewhere_is_one_line_naming_its_owners(
    tmp_path, overrides, names
):
    assert DATASETS.owners("split_file") == ("karpathy", "coco")
    assert DATASETS.owners("split_file", KarpathyDataConfig) == ("coco",)
    assert DATASETS.owners("annotations") == ("coco",) and DATASETS.owners("root") == ()
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump({"data": {k.split(".", 1)[1]: v for k, v in overrides.items()}}))
    for read in (
        lambda: load_config(None, overrides),
        lambda: apply_overrides(Config(), overrides, CHECKPOINT_SECTIONS),
    ):
        with raises_naming(ConfigError, *names):
            read()
    with raises_naming(ConfigError, path, *names):
        load_config(path)  # a user's file is read strictly


def test_karpathy_set_over_the_default_shapes_configuration_leaves_the_shapes_options_out(caplog):
    overrides = parse_overrides(["data.dataset=karpathy", "data.split_file=data/dataset_flickr8k.json"])
    config = load_config(None, overrides, warn_left_out=False)
    assert config.data == KarpathyDataConfig(split_file="data/dataset_flickr8k.json")
    coco = apply_overrides(
        config, {"data.dataset": "coco", "data.annotations": "a.json"}, CHECKPOINT_SECTIONS
    )
    assert coco.data == CocoDataConfig(split_file="data/dataset_flickr8k.json", annotations=("a.json",))
    back = apply_overrides(coco, {"data.dataset": "karpathy"}, CHECKPOINT_SECTIONS)  # annotations left out
    assert back.data == config.data
    moved = apply_overrides(coco, {"data.dataset": "shapes"}, CHECKPOINT_SECTIONS)
    assert type(moved.data) is ShapesDataConfig and moved.data.root == coco.data.root


def test_the_shipped_karpathy_configurations_load_into_their_reader_options():
    from importlib import resources

    shipped = resources.files("captioning") / "configs"
    for name in (
        "coco_lite0",
        "coco_resnet101",
        "coco_transformer",
        "coco_clip_vit",
        "flickr8k",
        "flickr30k",
    ):
        data = load_config(Path(str(shipped / f"{name}.yaml"))).data
        assert type(data) is KarpathyDataConfig and data.split_file, name


def test_a_stored_shapes_configuration_from_before_the_move_loads_without_the_karpathy_options():
    older = {**to_dict(SMALL_SHAPES), "split_file": None, "annotations": [], "restval_to_train": True}
    stored = from_dict({"data": older}, stored=True).data
    assert stored == SMALL_SHAPES
    with raises_naming(ConfigError, "data.annotations", "coco", "data.dataset 'shapes'"):
        from_dict({"data": older})  # a user's file is read strictly
    # An older run's configuration of the coco reader, with the Shapes options every run held then.
    older_coco = {
        **to_dict(ShapesDataConfig()),
        "dataset": "coco",
        "annotations": ["a.json"],
        "split_file": None,
    }
    assert from_dict({"data": older_coco}, stored=True).data == CocoDataConfig(annotations=("a.json",))


def test_the_pre_move_run_checkpoint_and_model_folder_configurations_load():
    # Written when DataConfig held split_file, annotations and restval_to_train: a Shapes run's.
    from tool_runs import REPO

    from captioning.hub.model_folder import load_folder

    fixtures = REPO / "tests" / "fixtures" / "pre_move"
    run_config = fixtures / "run" / "config.yaml"
    assert {"split_file", "annotations", "restval_to_train"} <= set(
        yaml.safe_load(run_config.read_text())["data"]
    )
    checkpoint = fixtures / "run" / "checkpoints" / "best.pt"
    configs = [
        load_config(run_config, stored=True),
        checkpoint_config(load_checkpoint(checkpoint), checkpoint)[0],
        checkpoint_config(load_folder(fixtures / "model"), fixtures / "model")[0],
    ]
    for config in configs:
        assert type(config.data) is ShapesDataConfig and config.data.shapes_train == 16
    assert configs[0].data == configs[1].data == configs[2].data
    # evaluate.py --set data.dataset=karpathy --set data.split_file=... over such a checkpoint
    moved = apply_overrides(
        configs[1], {"data.dataset": "karpathy", "data.split_file": "split.json"}, CHECKPOINT_SECTIONS
    )
    assert moved.data == KarpathyDataConfig(
        root=configs[1].data.root, split_file="split.json", min_word_count=1
    )


def test_a_runs_old_config_yaml_given_as_config_loads_and_a_users_file_is_still_strict(tmp_path):
    import argparse

    from tool_runs import REPO

    from captioning.cli.common import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    old = (REPO / "tests" / "fixtures" / "pre_move" / "run" / "config.yaml").read_text()
    users = tmp_path / "mine" / "config.yaml"
    users.parent.mkdir()
    users.write_text(old)
    with raises_naming(ConfigError, users, "data.annotations", "coco", "data.dataset 'shapes'"):
        config_from_args(parser.parse_args(["--config", str(users)]))
    (users.parent / "history.json").write_text("{}")  # a run folder: its config.yaml is the run's
    config = config_from_args(parser.parse_args(["--config", str(users), "--set", "train.lr=2e-4"]))
    assert type(config.data) is ShapesDataConfig and config.data.shapes_train == 16
    assert config.train.lr == pytest.approx(2e-4)
