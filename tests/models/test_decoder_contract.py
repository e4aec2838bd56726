"""The decoder contract, over every registered decoder family (``DECODERS``).

A newly registered family is covered by these tests once it has a small configuration in ``SMALL``
(``test_every_registered_decoder_has_a_small_configuration`` asks for one): teacher forcing equals
the step-by-step loop, ``state.select`` reorders rows as beam search needs, the configuration
round-trips through the dict a checkpoint stores, and the family's training objective gives a
finite loss whose gradient reaches every parameter.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from messages import raises_naming

from captioning.config import DECODERS as CONFIG_DECODERS
from captioning.config import (
    ConfigError,
    DecoderConfig,
    LSTMDecoderConfig,
    ModelConfig,
    TrainConfig,
    TransformerDecoderConfig,
    to_dict,
)
from captioning.config.loading import from_dict, load_config
from captioning.config.reference import reference_markdown
from captioning.data.vocab import Vocabulary
from captioning.models.attention import SCORERS
from captioning.models.base import DECODERS, CaptionDecoder, register_decoder
from captioning.models.captioner import build_decoder, check_model_config
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.registry import UnknownNameError
from captioning.training.losses import OBJECTIVES, objective_of

C, GRID, V = 12, (3, 3), 13  # annotation channels, grid, vocabulary
P = GRID[0] * GRID[1]

# Small options of each registered family (the rest are its defaults), with dropout on: eval mode must
# turn it off in both paths.
SMALL = {
    "lstm": {"embed_dim": 16, "hidden_dim": 16, "attention_dim": 16, "num_heads": 2, "dropout": 0.3},
    "transformer": {
        "d_model": 16,
        "num_heads": 2,
        "d_ff": 32,
        "encoder_layers": 1,
        "decoder_layers": 2,
        "dropout": 0.3,
    },
}

pytestmark = pytest.mark.usefixtures("single_thread")


def small_decoder(kind: str, seed: int = 0, **changes) -> CaptionDecoder:
    torch.manual_seed(seed)
    config = DECODERS[kind].config(**{**SMALL[kind], **changes})
    return build_decoder(config, V, C, GRID)


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two images, three captions of different lengths (the second image has two)."""
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(2, P, C, generator=generator)  # (B, P, C)
    captions = torch.randint(4, V, (3, 6), generator=generator)  # (N, L)
    captions[:, 0] = Vocabulary.start_id
    lengths = torch.tensor([6, 4, 5])
    for row, length in enumerate(lengths.tolist()):
        captions[row, length - 1] = Vocabulary.end_id
        captions[row, length:] = Vocabulary.pad_id
    return annotations, captions, lengths, torch.tensor([0, 1, 1])


def test_every_registered_decoder_has_a_small_configuration():
    assert set(DECODERS.names()) <= set(SMALL), "add a small configuration of the new decoder to SMALL"


@pytest.mark.parametrize("kind", DECODERS.names())
def test_teacher_forcing_equals_the_step_by_step_loop(kind):
    decoder = small_decoder(kind).eval()
    annotations, captions, lengths, image_index = batch()
    with torch.no_grad():
        output = decoder(annotations, captions, lengths, image_index)
        rows = annotations.index_select(0, image_index)  # (N, P, C): each caption with its image
        prepared, state = decoder.prepare(rows), decoder.init_state(rows)
        for t in range(int(lengths.max()) - 1):
            step = decoder.step(prepared, captions[:, t], state)
            state = step.state
            alive = lengths - 1 > t  # (N,) captions with a target at step t
            expected = torch.log_softmax(output.logits[alive, t].float(), dim=-1)
            torch.testing.assert_close(step.log_probs[alive], expected, rtol=0, atol=1e-5)
            torch.testing.assert_close(
                step.alpha.reshape(len(alive), -1)[alive], output.alphas[alive, t], atol=1e-5, rtol=0
            )
    assert output.mask.sum(1).tolist() == (lengths - 1).tolist()


@pytest.mark.parametrize("kind", DECODERS.names())
def test_select_reorders_the_state_as_beam_search_does(kind):
    decoder = small_decoder(kind, seed=2).eval()
    annotations = torch.randn(3, P, C)
    order = torch.tensor([2, 0, 2, 1])  # reordered and repeated rows
    tokens = torch.tensor([5, 6, 7])
    with torch.no_grad():
        prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
        first = decoder.step(prepared, tokens, state)
        reordered = decoder.step(prepared.select(order), tokens[order], first.state.select(order))
        straight = decoder.step(prepared, tokens, first.state)
    torch.testing.assert_close(reordered.log_probs, straight.log_probs[order], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", DECODERS.names())
def test_the_configuration_round_trips_through_a_checkpoint_dict(kind):
    config = DECODERS[kind].config(**SMALL[kind])
    stored = to_dict(ModelConfig(decoder=config))
    assert stored["decoder"]["kind"] == kind
    rebuilt = from_dict({"model": stored}).model.decoder
    assert rebuilt == config and type(rebuilt) is DECODERS[kind].config
    assert isinstance(build_decoder(rebuilt, V, C, GRID), DECODERS[kind].implementation)


@pytest.mark.parametrize("kind", DECODERS.names())
def test_the_training_objective_is_finite_and_reaches_every_parameter(kind):
    decoder = small_decoder(kind, seed=3).train()
    annotations, captions, lengths, image_index = batch(seed=4)
    assert decoder.objective in OBJECTIVES
    output = decoder(annotations, captions, lengths, image_index)
    train = TrainConfig(label_smoothing=0.1)
    terms = objective_of(decoder)(
        decoder, output, captions, DECODERS[kind].config(**SMALL[kind]), train, None
    )
    assert torch.isfinite(terms.total)
    terms.total.backward()
    untouched = [name for name, p in decoder.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert untouched == []


def test_hard_attention_trains_with_its_own_objective():
    decoder = small_decoder("lstm", attention="hard")
    assert (
        decoder.objective == "hard_attention" and DECODERS["lstm"].implementation.objective == "cross_entropy"
    )


def test_an_option_of_another_family_is_refused_naming_both():
    with raises_naming(ConfigError, "model.decoder.d_model", "transformer", "'lstm'"):
        from_dict({"model": {"decoder": {"kind": "lstm", "d_model": 64}}})
    with raises_naming(ConfigError, "model.decoder.kind", "'gru'", "lstm", "transformer", "--import"):
        from_dict({"model": {"decoder": {"kind": "gru"}}})


def test_a_stored_configuration_of_every_familys_options_reads_as_its_own_family():
    # Checkpoints written before each family had its own class stored every family's options.
    flat = {**to_dict(LSTMDecoderConfig()), "d_model": 64, "d_ff": 128, "kind": "transformer"}
    decoder = from_dict({"model": {"decoder": flat}}, stored=True).model.decoder
    assert decoder.kind == "transformer" and decoder.d_model == 64 and not hasattr(decoder, "hidden_dim")


def test_an_unknown_scorer_is_refused_before_any_work_listing_the_registered_ones():
    config = ModelConfig(decoder=LSTMDecoderConfig(scoring="luong_concat"))
    with pytest.raises(UnknownNameError) as refused:
        check_model_config(config)
    message = str(refused.value)
    assert "model.decoder.scoring" in message and "'luong_concat'" in message
    assert all(name in message for name in SCORERS.names())


def test_one_registration_gives_a_new_family_its_class_and_its_configuration():
    @dataclasses.dataclass(frozen=True)
    class TinyConfig(DecoderConfig):
        kind: str = "tiny_lstm_for_test"
        tiny_width: int = 8  # the LSTM's size

    class TinyDecoder(ShowAttendTellDecoder):
        @classmethod
        def from_config(cls, config, vocab_size, annotation_dim, grid):
            return super().from_config(
                LSTMDecoderConfig(embed_dim=8, hidden_dim=config.tiny_width, attention_dim=8),
                vocab_size,
                annotation_dim,
            )

    with DECODERS.scope():
        register_decoder("tiny_lstm_for_test", TinyConfig)(TinyDecoder)
        # One entry, in the one registry configurations are read with.
        assert DECODERS is CONFIG_DECODERS
        family = DECODERS["tiny_lstm_for_test"]
        assert family.config is TinyConfig and family.implementation is TinyDecoder
        config = from_dict(
            {"model": {"decoder": {"kind": "tiny_lstm_for_test", "tiny_width": 6}}}
        ).model.decoder
        assert type(config) is TinyConfig and config.tiny_width == 6
        assert load_config(None, {"model.decoder.kind": "tiny_lstm_for_test"}).model.decoder == TinyConfig()
        assert build_decoder(config, V, C, GRID).hidden_dim == 6
        assert "kind tiny_lstm_for_test: the LSTM's size" in reference_markdown()
        with raises_naming(ConfigError, "model.decoder.tiny_width", "tiny_lstm_for_test", "'transformer'"):
            from_dict({"model": {"decoder": {"kind": "transformer", "tiny_width": 6}}})
        with raises_naming(ValueError, "'tiny_lstm_for_test'", "registered"):
            register_decoder("tiny_lstm_for_test", TinyConfig)(TinyDecoder)
    assert "tiny_lstm_for_test" not in DECODERS  # the registry as it was for the other tests of this process


def test_a_subclass_of_the_lstm_registered_as_a_family_is_built_as_itself():
    """Its cell (``_recur``) is what it changes: a family built as the plain LSTM would drop it."""

    @dataclasses.dataclass(frozen=True)
    class DoubledConfig(LSTMDecoderConfig):
        kind: str = "doubled_for_test"

    class Doubled(ShowAttendTellDecoder):
        def _recur(self, embed_gates, context, state):
            return super()._recur(embed_gates, 2 * context, state)

    with DECODERS.registered("doubled_for_test", Doubled, DoubledConfig):
        decoder = build_decoder(DoubledConfig(**SMALL["lstm"]), V, C, GRID)
    assert type(decoder) is Doubled
    assert type(build_decoder(LSTMDecoderConfig(**SMALL["lstm"]), V, C, GRID)) is ShowAttendTellDecoder


def test_a_built_in_familys_decoder_joins_the_configuration_registered_for_it():
    with raises_naming(ValueError, "'lstm'", "registered"):
        register_decoder("lstm", LSTMDecoderConfig)(ShowAttendTellDecoder)
    assert DECODERS["lstm"].config is LSTMDecoderConfig
    assert DECODERS["lstm"].implementation is ShowAttendTellDecoder
    assert DECODERS["transformer"].config is TransformerDecoderConfig


def test_an_older_runs_config_file_reads_as_its_family_when_read_as_stored(tmp_path):
    # A run's config.yaml of an older version: the decoder section holds every family's options.
    flat = {**to_dict(LSTMDecoderConfig()), "kind": "transformer", "d_model": 32, "num_heads": 4}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model": {"decoder": flat}}), encoding="utf-8")
    assert load_config(path, stored=True).model.decoder == TransformerDecoderConfig(
        d_model=32, num_heads=4, dropout=0.5, doubly_stochastic=1.0
    )
    with raises_naming(ConfigError, path, "model.decoder.", "lstm", "'transformer'"):
        load_config(path)  # a user's file is read strictly


def test_a_kind_given_on_the_command_line_leaves_out_only_the_other_familys_options(tmp_path, caplog):
    path = tmp_path / "lstm.yaml"
    path.write_text(
        "model:\n  decoder:\n    kind: lstm\n    hidden_dim: 8\n    dropout: 0.3\n", encoding="utf-8"
    )
    config = load_config(path, {"model.decoder.kind": "transformer"})
    assert config.model.decoder == TransformerDecoderConfig(dropout=0.3)  # a shared option is kept
    assert "left out (hidden_dim); kept: dropout" in caplog.text
    path.write_text("model:\n  decoder:\n    kind: lstm\n    hiden_dim: 8\n", encoding="utf-8")
    with raises_naming(ConfigError, path, "'model.decoder.hiden_dim'", "d_model"):
        load_config(path, {"model.decoder.kind": "transformer"})  # a misspelt key is no family's: refused


def test_a_decoder_configuration_must_be_a_dataclass_of_its_kind():
    class NotADataclass(DecoderConfig):
        kind = "plain_for_test"

    with raises_naming(ValueError, "'plain_for_test'", "dataclass", "DecoderConfig"):
        register_decoder("plain_for_test", NotADataclass)(ShowAttendTellDecoder)
    assert "plain_for_test" not in DECODERS
