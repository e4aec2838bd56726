"""Configuration: YAML loading, dotted overrides, validation, round trips, the generated reference."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from messages import raises_naming

from captioning.cli.common import add_config_arguments, config_from_args
from captioning.config import Config, ConfigError, to_dict
from captioning.config.loading import (
    CHECKPOINT_SECTIONS,
    apply_overrides,
    check_overrides,
    from_dict,
    load_config,
    parse_overrides,
    save_config,
)
from captioning.config.reference import reference_markdown

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_shipped_configs_load():
    assert load_config() == Config()
    for path in sorted((REPO / "configs").glob("*.yaml")):
        config = load_config(path)
        assert isinstance(config, Config), path
    assert load_config(REPO / "configs" / "coco_resnet101.yaml").model.encoder.name == "resnet101"
    assert load_config(REPO / "configs" / "flickr8k.yaml").model.encoder.name == "vgg19"


def test_overrides_are_typed_and_win_over_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  epochs: 3\nmodel:\n  decoder:\n    gate: channel\n")
    config = load_config(
        path,
        {
            "train.lr": "2e-4",
            "model.decoder.deep_output": "false",
            "data.dataset": "coco",
            "data.annotations": "a.json,b.json",
        },
    )
    assert config.train.lr == pytest.approx(2e-4)
    assert config.train.epochs == 3
    assert config.model.decoder.gate == "channel"
    assert config.model.decoder.deep_output is False
    assert config.data.annotations == ("a.json", "b.json")


@pytest.mark.parametrize(
    "key, value, names",
    [
        ("decode.beam_size", "0", ("decode.beam_size", "0")),
        ("train.lr", "-1", ("train.lr", "-1")),
        ("train.epochs", "two", ("train.epochs", "'two'")),
        ("train.epochs", "2.5", ("train.epochs", "'2.5'")),
        ("model.decoder.deep_output", "maybe", ("model.decoder.deep_output", "'maybe'")),
        ("train.lrr", "1", ("'train.lrr'", "epochs")),  # the keys it could have meant
        ("decode.top_p", "0", ("decode.top_p", "0.0")),
        ("decode.top_p", "1.5", ("decode.top_p", "1.5")),
        ("decode.beam_groups", "2", ("decode.beam_groups", "decode.beam_size", "2")),
        ("decode.diversity", "-1", ("decode.diversity", "-1")),
        ("decode.repetition_penalty", "0", ("decode.repetition_penalty", "0")),
        ("decode.num_return", "4", ("decode.num_return", "decode.beam_size", "4")),
        ("decode.num_return", "0", ("decode.num_return", "0")),
    ],
)
def test_bad_values_are_refused_with_the_key(key, value, names):
    overrides = {key: value}
    with raises_naming(ConfigError, *names):
        load_config(None, overrides)


def test_bad_files(tmp_path):
    with raises_naming(ConfigError, tmp_path / "missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    with raises_naming(ConfigError, broken, "YAML"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with raises_naming(ConfigError, listed, "mapping"):
        load_config(listed)


def test_save_and_dict_round_trip(tmp_path):
    config = load_config(REPO / "configs" / "coco_resnet101.yaml", {"train.lr": "3e-4"})
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    assert from_dict(to_dict(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.train.lr = 1.0


def test_command_line_flags_and_set(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(
        [
            "--config",
            str(REPO / "configs" / "flickr8k.yaml"),
            "--lr",
            "2e-4",
            "--set",
            "model.decoder.gate=none",
            "--set",
            "train.lr=9",
        ]
    )
    config = config_from_args(args)
    assert config.train.lr == pytest.approx(2e-4)  # the flag wins over --set and the file
    assert config.model.decoder.gate == "none"
    assert config.data.split_file.endswith("dataset_flickr8k.json")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        config_from_args(parser.parse_args(["--set", "novalue"]))


def test_overrides_on_a_loaded_configuration():
    config = load_config(REPO / "configs" / "shapes.yaml")
    overrides = parse_overrides(["decode.beam_size=5", "data.root = elsewhere", "decode.beam_size=7"])
    assert overrides == {"decode.beam_size": "7", "data.root": "elsewhere"}  # the later one wins
    changed = apply_overrides(config, overrides, CHECKPOINT_SECTIONS)
    assert changed.decode.beam_size == 7 and changed.data.root == "elsewhere"
    assert changed.model == config.model and changed.train == config.train
    assert dataclasses.replace(changed.decode, beam_size=config.decode.beam_size) == config.decode
    with raises_naming(ConfigError, "model.decoder.hidden_dim", "data.*", "decode.*"):
        apply_overrides(config, {"model.decoder.hidden_dim": "8"}, CHECKPOINT_SECTIONS)
    assert apply_overrides(config, {"model.decoder.hidden_dim": "8"}).model.decoder.hidden_dim == 8
    with raises_naming(ConfigError, "decode.beam_size", "'many'"):
        apply_overrides(config, {"decode.beam_size": "many"})
    with raises_naming(ConfigError, "'decode.beams'", "beam_size"):
        apply_overrides(config, {"decode.beams": "3"})
    for malformed in ("decode.beam_size", "=3"):
        with pytest.raises(ConfigError, match="KEY=VALUE"):
            parse_overrides([malformed])


def test_overrides_are_checked_alone_before_they_meet_a_configuration():
    # Key names, sections and types fail at once; rules between fields wait for the real configuration.
    for overrides, names in (
        ({"decode.beams": "3"}, ("'decode.beams'", "beam_size")),
        ({"decode": "3"}, ("decode", "decode.strategy")),  # a key of the section to set instead
        ({"decode.beam_size.x": "1"}, ("'decode.beam_size.x'", "'decode.beam_size'")),
        ({"decode.beam_size": "x"}, ("decode.beam_size", "'x'")),
        ({"model.decoder.gate": "none"}, ("model.decoder.gate", "data.*", "decode.*")),
    ):
        with raises_naming(ConfigError, *names):
            check_overrides(overrides, CHECKPOINT_SECTIONS)
    longer = {"decode.min_length": "25"}
    check_overrides(longer, CHECKPOINT_SECTIONS)  # fine against a checkpoint decoding up to 50 words
    trained = apply_overrides(Config(), {"decode.max_length": 50})
    assert apply_overrides(trained, longer, CHECKPOINT_SECTIONS).decode.min_length == 25
    with raises_naming(ConfigError, "decode.min_length", "max_length"):
        apply_overrides(Config(), longer, CHECKPOINT_SECTIONS)  # max_length 20


def test_configuration_page_is_the_generated_table():
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert reference_markdown() in page, (
        "docs/configuration.md is stale: paste the output of `python -m captioning.config.reference`"
    )
    assert page.count("| `") >= len(reference_markdown().splitlines()) - 2
