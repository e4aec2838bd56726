"""evaluate.py's and visualize.py's decoding flags are DecodeConfig's fields: a field added to the
class is a flag in ``--help`` (with its meaning), reaches the search from the flag, ``--set`` and the
Python API, and is in the scores' signature, with no other edit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image
from tool_runs import REPO, in_process

import captioning
from captioning.cli.decoding_flags import decode_class
from captioning.config import DecodeConfig, schema
from captioning.evaluation.signature import decode_description
from captioning.models import choices

pytestmark = pytest.mark.usefixtures("single_thread")

FIXTURE = REPO / "tests" / "fixtures" / "pre_move" / "run" / "checkpoints" / "best.pt"


@pytest.fixture
def new_field(monkeypatch):
    """DecodeConfig with one more field, as a fork's edit of the class makes it, and the values of it
    every search's choice saw."""
    assert "word_cap" not in {f.name for f in dataclasses.fields(DecodeConfig)}
    wider = dataclasses.make_dataclass(
        "DecodeConfig",
        [
            (
                "word_cap",
                int,
                dataclasses.field(default=0, metadata={"help": "a word id never said; 0 = none"}),
            )
        ],
        bases=(DecodeConfig,),
        frozen=True,
    )
    monkeypatch.setattr(schema, "DecodeConfig", wider)  # the class the configuration's decode section is
    seen: list[int] = []
    original = choices.choice_scores

    def choice_scores(scores, history, step, config):  # the field's use
        seen.append(config.word_cap)
        return original(scores, history, step, config)

    monkeypatch.setattr(choices, "choice_scores", choice_scores)
    return wider, seen


@pytest.fixture
def photos(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(folder / "red.png")
    return folder


def test_a_new_decoding_field_is_a_flag_that_reaches_the_search(new_field, photos, tmp_path):
    wider, seen = new_field
    assert decode_class() is wider
    shown = in_process("evaluate.py", "--help")
    assert shown.returncode == 0
    assert "--word-cap WORD_CAP" in shown.stdout and "a word id never said; 0 = none" in shown.stdout
    results = tmp_path / "captions.json"
    for flags in (["--word-cap", "7"], ["--set", "decode.word_cap=7"]):
        seen.clear()
        run = in_process(
            "evaluate.py", "--checkpoint", FIXTURE, "--images", photos, "--results", results, "--strategy",
            "greedy", "--no-progress", *flags, cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert seen and set(seen) == {7}, flags
    refused = in_process("evaluate.py", "--checkpoint", FIXTURE, "--images", photos, "--word-cap", "x")
    assert refused.returncode == 2 and "--word-cap" in refused.stderr


def test_visualize_takes_every_decoding_flag_too(new_field, photos, tmp_path):
    wider, seen = new_field
    shown = in_process("visualize.py", "--help")
    assert shown.returncode == 0
    assert "--word-cap WORD_CAP" in shown.stdout and "a word id never said; 0 = none" in shown.stdout
    for item in dataclasses.fields(DecodeConfig):
        assert "--" + item.name.replace("_", "-") in shown.stdout, item.name
    run = in_process(
        "visualize.py", photos / "red.png", "--checkpoint", FIXTURE, "--out-dir", tmp_path / "figures",
        "--strategy", "greedy", "--word-cap", "7", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert seen and set(seen) == {7}
    assert (tmp_path / "figures" / "red.png").is_file()


@pytest.mark.parametrize(
    "flags, names",
    [(["--temperature", "-1"], ["temperature", "-1"]), (["--top-p", "1.5"], ["top_p", "1.5"])],
    ids=["temperature", "top-p"],
)
def test_visualize_refuses_a_decoding_value_before_loading(flags, names, photos, tmp_path, monkeypatch):
    import captioning.cli.visualize as visualize_module

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the options were checked")

    monkeypatch.setattr(visualize_module, "load_for_tool", never)
    run = in_process(
        "visualize.py", photos / "red.png", "--checkpoint", FIXTURE, "--out-dir", tmp_path / "figures",
        *flags, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert all(name in last for name in names), last
    assert not (tmp_path / "figures").exists()


def test_a_new_decoding_field_reaches_the_api_and_the_signature(new_field):
    wider, seen = new_field
    model = captioning.load(FIXTURE)
    assert type(model.decode_config) is wider  # the checkpoint's decode section is read as the class
    model.caption([np.zeros((16, 16, 3), np.uint8)], strategy="greedy", word_cap=5)
    assert seen and set(seen) == {5}
    assert decode_description(wider(word_cap=5)) == "beam3.max20.word_cap=5"
    assert decode_description(wider()) == decode_description(DecodeConfig())


def test_every_decode_key_is_a_flag_and_the_flags_are_the_keys():
    from captioning.config.reference import field_help

    shown = in_process("evaluate.py", "--help").stdout
    meanings = field_help(DecodeConfig)
    for item in dataclasses.fields(DecodeConfig):
        flag = "--" + item.name.replace("_", "-")
        assert flag in shown, flag
        assert meanings[item.name], item.name  # each has its meaning for the help
    assert "--no-forbid-unk" in shown and "{greedy,beam,sample}" in shown
