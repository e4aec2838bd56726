"""A true-or-false option takes the same values from every door: 1 and 0 are numbers to YAML and to the
Python API, which refuse them for a bool, and so does ``--set`` (one line naming the key); the words
YAML reads as truth values (true/false, yes/no, on/off) are taken from a file and from ``--set``
alike."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from messages import raises_naming
from test_faults import assert_one_line_error, shapes
from test_hostile import short_run
from tool_runs import REPO, in_process

from captioning.config import Config, ConfigError, DecodeConfig, LSTMDecoderConfig
from captioning.config.loading import apply_overrides, check_overrides, load_config

pytestmark = pytest.mark.usefixtures("single_thread")
__all__ = ["shapes"]  # a fixture of another test module


@pytest.mark.parametrize("number", ["1", "0"])
def test_a_number_for_a_bool_is_refused_by_set_as_by_the_api_and_yaml(number, tmp_path):
    with raises_naming(ConfigError, "model.decoder.hidden_dropout", number):
        LSTMDecoderConfig(hidden_dropout=int(number))  # type: ignore[arg-type]
    path = tmp_path / "run.yaml"
    path.write_text(f"model:\n  decoder:\n    hidden_dropout: {number}\n", encoding="utf-8")
    assert yaml.safe_load(path.read_text(encoding="utf-8"))["model"]["decoder"]["hidden_dropout"] == int(
        number
    )
    with raises_naming(ConfigError, "model.decoder.hidden_dropout", number):
        load_config(path)
    with raises_naming(ConfigError, "model.decoder.hidden_dropout", repr(number)):
        check_overrides({"model.decoder.hidden_dropout": number})
    with raises_naming(ConfigError, "decode.block_trigrams", repr(number)):
        apply_overrides(Config(), {"decode.block_trigrams": number})


@pytest.mark.parametrize(
    ("word", "value"),
    [("true", True), ("False", False), ("yes", True), ("no", False), ("on", True), ("off", False)],
)
def test_the_words_yaml_reads_as_truth_values_are_taken_by_set_as_in_a_file(word, value, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"decode:\n  block_trigrams: {word}\n", encoding="utf-8")
    assert load_config(path).decode.block_trigrams is value
    assert apply_overrides(Config(), {"decode.block_trigrams": word}).decode.block_trigrams is value
    assert DecodeConfig(block_trigrams=value) == dataclasses.replace(DecodeConfig(), block_trigrams=value)


def test_train_refuses_hidden_dropout_one_in_one_line_before_work(shapes, tmp_path):
    run = tmp_path / "run"
    flags = short_run(shapes, run, **{"model.decoder.hidden_dropout": "1"})
    result = in_process("train.py", "--no-test", *flags, cwd=REPO)
    assert_one_line_error(result.returncode, result.stderr, "model.decoder.hidden_dropout", "'1'")
    assert not run.exists()
