"""The registry pattern every extension point uses (captioning.registry)."""

import subprocess
import sys
from pathlib import Path

import pytest
from messages import raises_naming

from captioning.registry import Registry, UnknownNameError

REPO = Path(__file__).resolve().parents[2]


def test_a_registered_entry_is_found_by_its_name_and_listed_in_registration_order():
    registry = Registry("widget", key="model.widget")

    @registry.register("second")
    def second():
        return 2

    registry.add("first", lambda: 1)
    assert registry["second"] is second
    assert registry.names() == ("second", "first")
    assert "first" in registry and "third" not in registry
    assert len(registry) == 2 and list(registry) == ["second", "first"]


def test_an_unknown_name_is_one_line_naming_the_key_and_every_registered_name():
    registry = Registry("widget", key="model.widget")
    registry.add("alpha", 1)
    registry.add("beta", 2)
    # the key, the name given, every registered name, the flag that registers one of your own
    with raises_naming(UnknownNameError, "model.widget", "'gamma'", "alpha, beta", "--import"):
        registry["gamma"]
    with pytest.raises(ValueError, match="gamma"):  # the command-line tools print a ValueError as one line
        registry.check("gamma")
    assert registry.check("beta") == "beta"


@pytest.mark.parametrize("name", ["", " padded", "two words", "tab\tname"])
def test_a_name_that_is_not_one_word_is_refused(name):
    with raises_naming(ValueError, "widget", repr(name)):
        Registry("widget").add(name, 1)


def test_a_name_is_registered_once():
    registry = Registry("widget")
    registry.add("alpha", 1)
    with raises_naming(ValueError, "widget", "'alpha'", "registered"):
        registry.add("alpha", 2)
    assert registry["alpha"] == 1


def test_an_entry_registered_for_a_block_is_gone_when_it_ends_however_it_ends():
    registry = Registry("widget")
    registry.add("alpha", 1)
    with registry.registered("beta", 2) as entry:
        assert entry == 2 and registry.names() == ("alpha", "beta")
    assert registry.names() == ("alpha",)
    with pytest.raises(KeyError), registry.scope():
        registry.add("gamma", 3)
        raise KeyError("a failing test")
    assert registry.names() == ("alpha",)
    with pytest.raises(ValueError, match="'alpha'"), registry.registered("alpha", 4):
        pass  # a name registered already is refused, and the scope leaves the first entry alone
    assert registry["alpha"] == 1


def test_a_scope_puts_back_a_familys_attached_class_and_its_options():
    from captioning.config import DECODERS, LSTMDecoderConfig
    from captioning.models.decoder import ShowAttendTellDecoder

    lstm = DECODERS["lstm"]
    with DECODERS.scope():
        lstm.implementation = None  # what attaching a class to registered options starts from
        DECODERS.register_family("lstm", LSTMDecoderConfig)(dict)
        assert DECODERS.implementation_of("lstm") is dict
    assert DECODERS["lstm"] is lstm and lstm.implementation is ShowAttendTellDecoder


def test_a_built_in_familys_class_attached_in_a_scope_by_its_first_import_stays():
    """A process whose first import of the decoders' package happens inside a scope (a tool run in a
    test) keeps the built-in family's class: that import is made once, and undoing what it attached
    left "unknown decoder 'lstm'" for every later test of the process. A family registered in the
    scope is still removed."""
    import dataclasses

    from captioning.config import DECODERS, DecoderConfig
    from captioning.registry import FamilyRegistry

    registry: FamilyRegistry = FamilyRegistry("decoder", "model.decoder.kind", DecoderConfig)
    options = DECODERS["lstm"].config
    registry.register_options("lstm")(options)
    mine = dataclasses.make_dataclass(
        "MineConfig", [("kind", str, dataclasses.field(default="mine"))], bases=(DecoderConfig,), frozen=True
    )
    with registry.scope():
        registry.register_family("lstm", options)(dict)  # the package's import attaches its class
        registry.register_family("mine", mine)(list)  # a family of one's own, registered in the block
    assert registry.implementation_of("lstm") is dict
    assert registry.names() == ("lstm",)


def test_every_registry_is_put_back_after_each_test_with_the_user_modules_it_imported(tmp_path):
    from tool_runs import kept_registries

    from captioning.models.attention import SCORERS
    from captioning.registry import registries

    assert SCORERS in registries()
    module = tmp_path / "scorer_of_a_test.py"
    module.write_text(
        "from captioning.models.attention import SCORERS\nSCORERS.add('scorer_of_a_test', object)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with kept_registries():
            import scorer_of_a_test  # noqa: F401

            assert "scorer_of_a_test" in SCORERS
    finally:
        sys.path.remove(str(tmp_path))
    assert "scorer_of_a_test" not in SCORERS and "scorer_of_a_test" not in sys.modules


def test_the_help_of_train_py_lists_every_registered_encoder_decoder_and_scorer():
    from tool_runs import script_module

    from captioning.config import DECODERS
    from captioning.models.attention import SCORERS
    from captioning.models.encoders import ENCODERS

    # One line: a name is never cut by the help's line breaks.
    text = " ".join(script_module("train.py").get_args_parser().format_help().split())
    for flag, registry in (("--encoder", ENCODERS), ("--decoder", DECODERS), ("--scoring", SCORERS)):
        listed = text.split(flag + " STR ", 1)[1].split(" --", 1)[0]  # its help, not the usage line
        assert all(f"{name}," in listed or f"{name} or" in listed for name in registry.names()), (
            flag,
            listed,
        )
    assert "timm:<model name>" in text and "registered by --import MODULE" in text


def test_parsing_a_command_line_does_not_import_the_registries():
    # Their names are read only when --help is printed: they import torch.
    code = (
        "import sys, train; train.get_args_parser().parse_args(['--encoder', 'resnet50']); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_the_encoder_and_scorer_examples_of_the_extending_page_register_and_build():
    # Run in a new process: the examples register names this process's other tests do not expect.
    page = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in page.split("```python\n")[1:]]
    examples = [block for block in blocks if "@register_encoder(" in block or "@SCORERS.register(" in block]
    assert len(examples) == 2
    check = """
import torch
from captioning.config import EncoderConfig, LSTMDecoderConfig
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.encoders import build_encoder

encoder = build_encoder(EncoderConfig(name="my_encoder", weights="none", image_size=64))
config = LSTMDecoderConfig(scoring="scaled_general", embed_dim=8, hidden_dim=8, attention_dim=8)
decoder = ShowAttendTellDecoder.from_config(config, 10, encoder.channels).eval()
grids = encoder(torch.rand(2, 3, 64, 64))  # (B, P, C)
step = decoder.step(decoder.prepare(grids), torch.tensor([1, 1]), decoder.init_state(grids))
print(encoder.channels, tuple(step.alpha.shape))
from captioning.models.encoders import EncoderWeightsError
try:  # offline (or a file missing): the project's one-line error, not urllib's
    build_encoder(EncoderConfig(name="my_encoder", weights="missing_weights.pth", image_size=64))
except EncoderWeightsError as error:
    print("refused:", str(error).splitlines()[0][:40].replace(" ", "_"))  # the file, named
"""
    code = "\n".join(examples) + check
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [
        "576",
        "(2,",
        "4)",
        "refused:",
        "missing_weights.pth:_encoder_weights_fil",
    ]  # MobileNetV3-Small: 576 channels, a 2x2 grid at 64 px; a weights file resolved by resolve_weights


@pytest.mark.slow
def test_the_reader_options_example_of_the_extending_page_registers_and_reads_its_option():
    # Run in a new process: the example registers a reader this process's contract tests do not expect.
    page = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = [block.split("```", 1)[0] for block in page.split("```python\n")[1:]]
    (example,) = [block for block in blocks if '@register_reader("first_captions"' in block]
    check = """
from captioning.config import ConfigError
from captioning.config.loading import load_config
from captioning.data.readers import reader_of

data = load_config(None, {"data.dataset": "first_captions", "data.captions_kept": "2"}).data
print(type(data).__name__, data.captions_kept, type(reader_of(data)).__name__)
try:
    load_config(None, {"data.dataset": "karpathy", "data.captions_kept": "2"})
except ConfigError as error:
    print(str(error).replace(" ", "_"))
"""
    result = subprocess.run(
        [sys.executable, "-c", example + check], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [
        "FirstCaptionsConfig",
        "2",
        "FirstCaptionsReader",
        "data.captions_kept_is_an_option_of_the_first_captions_dataset_reader,_not_of_data.dataset_'karpathy'",
    ]


def test_an_encoder_name_with_a_colon_is_refused_it_would_shadow_a_family():
    from captioning.models.encoders import ENCODERS, register_encoder

    with raises_naming(ValueError, "'timm:resnet50'", "colon"):
        register_encoder("timm:resnet50")(lambda weights, image_size: None)
    assert "timm:resnet50" not in ENCODERS
