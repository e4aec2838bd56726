"""Every shipped configuration's header is true: what it says it reproduces, its settings match, and a
header that names a paper or released code says what it reproduces and what it does not."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import pytest
from tool_runs import REPO

from captioning.config import Config
from captioning.config.loading import load_config

CONFIGS = sorted((REPO / "captioning" / "configs").glob("*.yaml"))
# A paper ("Xu et al. 2015"), a repository ("owner/name", not a path of this project) or a released
# script ("capgen.py", not one of this project's three).
SOURCE = re.compile(
    r"[A-Z][a-z]+ et al\. \d{4}"
    r"|(?<![/\w.-])(?!(?:docs|configs|data|runs|tests)/)[A-Za-z][\w-]*/[A-Za-z][\w.-]*[A-Za-z](?<!\.md)(?<!\.yaml)"
    r"|(?<![/\w])(?!(?:train|evaluate|visualize)\.py|test_)\w+\.py\b"
)


def _arctic(config: Config) -> bool:
    decoder, train = config.model.decoder, config.train
    return (
        (config.model.encoder.name, config.model.encoder.image_size, config.model.encoder.grid_size)
        == ("vgg19", 224, 14)
        and (decoder.embed_dim, decoder.hidden_dim, decoder.attention_dim) == (512, 1800, 512)
        and (decoder.annotation_layers, decoder.init_layers) == (2, 2)
        and decoder.gate == "scalar"
        and decoder.deep_output
        and decoder.output_tanh
        and decoder.hidden_dropout
        and decoder.dropout == 0.5
        and decoder.hard_expected_prob == 0.5
        and decoder.hard_alpha_gradients == "authors"
        and decoder.hard_expected_draw == "minibatch"
        and math.isclose(decoder.doubly_stochastic, 64 / 196, abs_tol=5e-4)
        and math.isclose(decoder.hard_entropy, 64 * 0.002, abs_tol=5e-4)
        and math.isclose(decoder.hard_reinforce, 64 / (10 * 12), abs_tol=5e-4)
        and train.batch_size * train.captions_per_image == 64
        and train.lr == 2e-4
        and train.grad_clip == 0
    )


# Each source a header may claim to reproduce, and what its settings must then be.
CLAIMS: dict[str, Callable[[Config], bool]] = {
    "Xu et al. 2015": lambda c: (
        c.model.decoder.kind == "lstm"
        and c.model.decoder.attention == "soft"
        and c.model.decoder.gate == "scalar"
        and c.model.decoder.deep_output
        and c.model.decoder.dropout == 0.5
        and math.isclose(c.model.decoder.doubly_stochastic, 64 / 196, abs_tol=0.005)
    ),
    "kelvinxu/arctic-captions": _arctic,
    "evaluate_coco.py": _arctic,
    "optimizers.py": _arctic,
    "capgen.py": _arctic,
    # the header says how its decoding differs from generate_caps.py's (beam 1, 200 words): beam 3, 20 words
    "generate_caps.py": lambda c: (
        (c.decode.strategy, c.decode.beam_size, c.decode.max_length, c.decode.length_alpha)
        == ("beam", 3, 20, 0)
    ),
    "Vaswani et al. 2017": lambda c: (
        c.model.decoder.kind == "transformer"
        and not c.model.decoder.pre_norm
        and (c.model.decoder.d_model, c.model.decoder.num_heads, c.model.decoder.d_ff) == (512, 8, 2048)
        and c.model.decoder.dropout == 0.1
        and c.train.label_smoothing == 0.1
    ),
    "ruotianluo/self-critical.pytorch": lambda c: (
        c.train.schedule == "noam"
        and c.train.warmup_steps == 20000
        and c.train.adam_beta2 == 0.98
        and math.isclose(c.train.lr, 512**-0.5 * 20000**-0.5, rel_tol=0.01)
    ),
}


def header(path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(
        line.lstrip("# ") for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))]
    )


def reproduced_part(text: str) -> str:
    """What the header claims: from "Reproduces" up to "Does not reproduce" (the part without sources
    when it says neither)."""
    start = text.find("Reproduces")
    end = text.find("Does not reproduce")
    return text[start:end] if start >= 0 else ""


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_header_claims_only_sources_whose_settings_match(path):
    text = header(path)
    config = load_config(path)
    claimed = set(SOURCE.findall(reproduced_part(text)))
    for source in claimed:
        assert source in CLAIMS, f"{path.name} claims {source!r}, which no check here knows"
        assert CLAIMS[source](config), f"{path.name}: its settings are not those of {source}"
    if SOURCE.search(text):  # names a source: says what it reproduces and what not
        assert "Reproduces" in text and "Does not reproduce" in text, path.name


def test_the_checks_can_fail():
    arctic = load_config(REPO / "configs" / "coco_arctic.yaml")
    assert _arctic(arctic) and CLAIMS["Xu et al. 2015"](arctic)
    assert not _arctic(load_config(REPO / "configs" / "coco_resnet101.yaml"))
    transformer = load_config(REPO / "configs" / "coco_transformer.yaml")
    assert CLAIMS["Vaswani et al. 2017"](transformer)
    decoder = dataclasses.replace(transformer.model.decoder, pre_norm=True)
    pre_norm = dataclasses.replace(transformer, model=dataclasses.replace(transformer.model, decoder=decoder))
    assert not CLAIMS["Vaswani et al. 2017"](pre_norm)
    assert set(
        SOURCE.findall("Reproduces Cornia et al. 2020 and ruotianluo/self-critical.pytorch, capgen.py")
    ) == {
        "Cornia et al. 2020",
        "ruotianluo/self-critical.pytorch",
        "capgen.py",
    }
