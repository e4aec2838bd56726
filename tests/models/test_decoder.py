"""The attention LSTM decoder and its losses, pinned to a plain step-by-step reference."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from messages import raises_naming
from search_options import settings

from captioning.config import ConfigError, LSTMDecoderConfig
from captioning.config.loading import from_dict
from captioning.models.attention import SCORERS
from captioning.models.decoder import DecoderOutput, HardAttentionDecoder, ShowAttendTellDecoder
from captioning.training.losses import caption_loss, hard_attention_loss

# annotation channels (the hidden size: every scorer builds, dot too), grid positions, vocabulary, heads
C, P, V, HEADS = 24, 9, 11, 4

# Every registered scorer (a newly registered one is covered by these tests), and additive with ReLU.
SCORINGS = [(name, "tanh") for name in SCORERS.names()] + [("additive", "relu")]
SCORING_IDS = [f"{name}-{activation}" for name, activation in SCORINGS]


pytestmark = pytest.mark.usefixtures("single_thread")


def make_decoder(
    scoring: str = "additive",
    activation: str = "tanh",
    attention: str = "soft",
    gate: str = "scalar",
    deep_output: bool = True,
    dropout: float = 0.0,
    expected_prob: float = 0.5,
) -> ShowAttendTellDecoder:
    config = LSTMDecoderConfig(
        attention=attention,
        scoring=scoring,
        activation=activation,
        num_heads=HEADS,
        embed_dim=16,
        hidden_dim=24,
        attention_dim=16,
        gate=gate,
        deep_output=deep_output,
        dropout=dropout,
        hard_expected_prob=expected_prob,
    )
    return ShowAttendTellDecoder.from_config(config, V, C)


def make_batch(seed: int = 0):
    """2 images, 5 captions of different lengths (image_index 0 0 1 1 1), padded with 0."""
    generator = torch.Generator().manual_seed(seed)
    annotations = torch.randn(2, P, C, generator=generator)
    lengths = torch.tensor([6, 3, 8, 2, 5])  # tokens incl. <start> and <end>
    captions = torch.zeros(5, 9, dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        captions[i, 0] = 1
        captions[i, 1 : length - 1] = torch.randint(4, V, (length - 2,), generator=generator)
        captions[i, length - 1] = 2
    return annotations, captions, lengths, torch.tensor([0, 0, 1, 1, 1])


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("deep_output", [True, False])
@pytest.mark.parametrize("gate", ["scalar", "channel", "none"])
def test_output_shapes(gate, deep_output):
    torch.manual_seed(0)
    decoder = make_decoder(gate=gate, deep_output=deep_output).train()
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    assert isinstance(output, DecoderOutput)
    assert output.logits.shape == (5, 7, V)
    assert output.alphas.shape == (5, 7, P)
    assert output.mask.shape == (5, 7) and output.mask.dtype == torch.bool
    assert output.mask.sum(1).tolist() == (lengths - 1).tolist()
    if gate == "none":
        assert output.betas is None
    else:
        assert output.betas.shape == (5, 7)
        real = output.betas[output.mask]
        assert ((real > 0) & (real < 1)).all()  # sigmoid gate
    assert output.location_log_probs is None and output.entropies is None  # soft attention
    assert torch.isfinite(output.logits).all()


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_hard_attention_outputs_in_train_mode_only(scoring, activation):
    torch.manual_seed(1)
    decoder = make_decoder(scoring, activation, attention="hard", expected_prob=0.0).train()
    assert isinstance(decoder, HardAttentionDecoder)
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    assert output.location_log_probs.shape == (5, 7) and output.entropies.shape == (5, 7)
    real = output.mask
    assert (output.location_log_probs[real] <= 0).all()
    assert (output.location_log_probs[real] < 0).any()  # sampled locations (no expected context)
    assert (output.entropies[real] >= 0).all() and (output.entropies[real] <= math.log(P) + 1e-5).all()
    assert (output.location_log_probs[~real] == 0).all() and (output.entropies[~real] == 0).all()
    decoder.eval()
    output = decoder(annotations, captions, lengths, image_index)
    assert output.location_log_probs is None and output.entropies is None


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_alphas_sum_to_one_on_real_steps_and_zero_on_padding(scoring, activation):
    torch.manual_seed(2)
    decoder = make_decoder(scoring, activation).eval()
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    sums = output.alphas.sum(-1)
    torch.testing.assert_close(sums[output.mask], torch.ones(int(output.mask.sum())))
    assert (output.alphas[~output.mask] == 0).all()
    assert (output.alphas >= 0).all()


# ----------------------------------------------------------------------------- padding
def loss_and_grads(decoder, annotations, captions, lengths, image_index):
    decoder.zero_grad()
    output = decoder(annotations, captions, lengths, image_index)
    terms = caption_loss(output, captions, penalty_weight=1.0)
    terms.total.backward()
    grads = {name: p.grad.clone() for name, p in decoder.named_parameters() if p.grad is not None}
    return terms, grads


@pytest.mark.parametrize("gate", ["scalar", "none"])
@pytest.mark.parametrize("deep_output", [True, False])
def test_padding_contributes_nothing_to_loss_or_gradients(deep_output, gate):
    torch.manual_seed(3)
    decoder = make_decoder(deep_output=deep_output, gate=gate).eval()
    annotations, captions, lengths, image_index = make_batch()
    reference, reference_grads = loss_and_grads(decoder, annotations, captions, lengths, image_index)

    garbage = captions.clone()
    after_end = torch.arange(captions.size(1)) >= lengths.unsqueeze(1)  # (N, L) positions after <end>
    garbage[after_end] = torch.randint(0, V, (int(after_end.sum()),))
    garbage = torch.cat([garbage, torch.randint(0, V, (5, 4))], dim=1)  # 4 more padding columns
    assert not torch.equal(garbage[:, : captions.size(1)], captions)
    terms, grads = loss_and_grads(decoder, annotations, garbage, lengths, image_index)

    torch.testing.assert_close(terms.cross_entropy, reference.cross_entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(terms.attention_penalty, reference.attention_penalty, rtol=0, atol=1e-6)
    torch.testing.assert_close(terms.total, reference.total, rtol=0, atol=1e-6)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-5, atol=1e-7, msg=name)


# ----------------------------------------------------------------------------- reference loop
def step_by_step(decoder, annotations, captions, lengths, image_index):
    """Per caption, ``decoder.step`` from ``init_state``: log-probs, alphas and betas of real steps."""
    results = []
    for i in range(captions.size(0)):
        image = image_index[i : i + 1]
        prepared = decoder.prepare(annotations).select(image)
        state = decoder.init_state(annotations).select(image)
        log_probs, alphas, betas = [], [], []
        for t in range(int(lengths[i]) - 1):
            out = decoder.step(prepared, captions[i, t : t + 1], state)
            state = out.state
            log_probs.append(out.log_probs[0])
            alphas.append(out.alpha[0])
            betas.append(None if out.beta is None else out.beta[0])
        results.append(
            (torch.stack(log_probs), torch.stack(alphas), None if betas[0] is None else torch.stack(betas))
        )
    return results


@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("deep_output", [True, False])
@pytest.mark.parametrize("gate", ["scalar", "channel", "none"])
@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_teacher_forcing_equals_step_loop(scoring, activation, gate, deep_output, attention):
    torch.manual_seed(5)
    # dropout > 0 checks that eval mode turns it off in both paths
    decoder = make_decoder(scoring, activation, attention, gate, deep_output, dropout=0.3).eval()
    annotations, captions, lengths, image_index = make_batch(seed=1)
    with torch.no_grad():
        output = decoder(annotations, captions, lengths, image_index)
        reference = step_by_step(decoder, annotations, captions, lengths, image_index)
    forward_log_probs = torch.log_softmax(output.logits, dim=-1)
    for i, (log_probs, alphas, betas) in enumerate(reference):
        steps = int(lengths[i]) - 1
        torch.testing.assert_close(forward_log_probs[i, :steps], log_probs, rtol=0, atol=1e-5)
        torch.testing.assert_close(output.alphas[i, :steps], alphas, rtol=0, atol=1e-5)
        if gate == "none":
            assert output.betas is None and betas is None
        else:
            torch.testing.assert_close(output.betas[i, :steps], betas, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_hard_attention_in_eval_mode_is_soft_attention(scoring, activation):
    torch.manual_seed(11)
    hard = make_decoder(scoring, activation, attention="hard").eval()
    soft = make_decoder(scoring, activation, attention="soft").eval()
    state = {k: v for k, v in hard.state_dict().items() if k != "reward_baseline"}
    soft.load_state_dict(state)
    annotations, captions, lengths, image_index = make_batch()
    with torch.no_grad():
        expected = soft(annotations, captions, lengths, image_index)
        actual = hard(annotations, captions, lengths, image_index)
    torch.testing.assert_close(actual.logits, expected.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(actual.alphas, expected.alphas, rtol=0, atol=1e-6)


def test_captions_of_one_image_share_it_and_order_does_not_matter():
    torch.manual_seed(6)
    decoder = make_decoder().eval()
    annotations, captions, lengths, image_index = make_batch()
    with torch.no_grad():
        output = decoder(annotations, captions, lengths, image_index)
        # one image per caption, expanded by hand, in reversed order
        order = torch.arange(4, -1, -1)
        expanded = decoder(annotations[image_index[order]], captions[order], lengths[order])
    torch.testing.assert_close(expanded.logits, output.logits[order], rtol=0, atol=1e-5)
    torch.testing.assert_close(expanded.alphas, output.alphas[order], rtol=0, atol=1e-5)
    assert torch.equal(expanded.mask, output.mask[order])


# ----------------------------------------------------------------------------- training
def fixed_captions():
    """4 captions of 2 images with different lengths, words chosen so they must be memorised."""
    captions = torch.tensor(
        [[1, 4, 5, 6, 7, 2, 0], [1, 8, 9, 2, 0, 0, 0], [1, 10, 4, 4, 9, 8, 2], [1, 6, 2, 0, 0, 0, 0]]
    )
    lengths = torch.tensor([6, 4, 7, 3])
    return captions, lengths, torch.tensor([0, 0, 1, 1])


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("scoring, activation", SCORINGS, ids=SCORING_IDS)
def test_overfits_four_captions(scoring, activation, attention):
    torch.manual_seed(7)
    decoder = make_decoder(scoring, activation, attention).train()
    annotations = torch.randn(2, P, C)
    captions, lengths, image_index = fixed_captions()
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    losses = []
    for _ in range(45):  # the weightless dot scorer under hard attention is the slowest to halve it
        output = decoder(annotations, captions, lengths, image_index)
        if attention == "hard":
            terms = hard_attention_loss(decoder, output, captions, penalty_weight=1.0, entropy_weight=0.002)
        else:
            terms = caption_loss(output, captions, penalty_weight=1.0)
        optimizer.zero_grad()
        terms.total.backward()
        optimizer.step()
        assert torch.isfinite(terms.total)
        losses.append(terms.cross_entropy.item())
    assert losses[-1] < 0.5 * losses[0], losses
    if attention == "hard":
        assert torch.isfinite(decoder.reward_baseline)
        assert terms.hard_attention is not None and torch.isfinite(terms.hard_attention)


def test_hard_attention_baseline_starts_at_first_reward_then_moves_average():
    torch.manual_seed(8)
    decoder = make_decoder(attention="hard").train()
    assert torch.isnan(decoder.reward_baseline)  # unset until the first step
    annotations, captions, lengths, image_index = make_batch()
    output = decoder(annotations, captions, lengths, image_index)
    hard_attention_loss(decoder, output, captions, penalty_weight=1.0, entropy_weight=0.0)
    mask = output.mask.float()
    token_log_probs = torch.log_softmax(output.logits, -1).gather(2, captions[:, 1:8].unsqueeze(2)).squeeze(2)
    reward = (token_log_probs * mask).sum(1).mean()  # the caption's log-likelihood, as in the paper
    torch.testing.assert_close(decoder.reward_baseline, reward.detach())
    assert "reward_baseline" in decoder.state_dict()


def test_hard_attention_draws_expected_or_sampled_anew_for_every_pass():
    # Which captions use the expected context is drawn per pass: a self-critical rollout must not
    # reuse the previous rollout's (or a teacher-forced pass's) draws.
    from captioning.models.decoding import rollout, sampler

    torch.manual_seed(10)
    decoder = make_decoder(attention="hard").train()
    annotations = torch.randn(16, P, C)
    lengths = torch.full((64,), 5)
    captions = torch.cat(
        [torch.ones(64, 1, dtype=torch.long), torch.randint(4, V, (64, 3)), torch.full((64, 1), 2)], dim=1
    )
    draws = []
    with torch.no_grad():
        decoder(annotations, captions, lengths, torch.arange(16).repeat_interleave(4))
        draws.append(decoder._use_expected.clone())
        for _ in range(3):
            rollout(decoder, annotations, sampler(), settings(max_length=3), repeats=4)  # 64 rows
            draws.append(decoder._use_expected.clone())
    assert all(d.shape == (64,) for d in draws)
    assert 0 < sum(int(d.sum()) for d in draws) < 4 * 64  # both kinds occur
    assert len({tuple(d.tolist()) for d in draws}) == len(draws)  # never the same draw twice


def hard_draws(draw: str, passes: int = 40) -> list[torch.Tensor]:
    """Which of 8 captions used the expected context, for each of ``passes`` teacher-forced passes."""
    torch.manual_seed(11)
    config = LSTMDecoderConfig(
        attention="hard", embed_dim=8, hidden_dim=8, attention_dim=8, dropout=0.0, hard_expected_draw=draw
    )
    decoder = ShowAttendTellDecoder.from_config(config, V, C).train()
    annotations, captions = torch.randn(8, P, C), torch.randint(4, V, (8, 5))
    captions[:, 0], captions[:, -1] = 1, 2
    draws = []
    with torch.no_grad():
        for _ in range(passes):
            output = decoder(annotations, captions, torch.full((8,), 5), torch.arange(8))
            expected_rows = output.location_log_probs[:, 0] == 0  # the expected context's rows log 0
            draws.append(decoder._use_expected.clone())
            assert torch.equal(expected_rows, draws[-1])
    return draws


def test_hard_attention_minibatch_draw_is_one_choice_for_all_captions():
    # capgen.py draws h_sampling_mask once per minibatch: every caption of a pass makes the same choice,
    # and passes differ; the paper's per-caption draw mixes the two kinds within a pass.
    minibatch, caption = hard_draws("minibatch"), hard_draws("caption")
    assert all(d.shape == (8,) and (d.all() or not d.any()) for d in minibatch)
    assert 0 < sum(bool(d[0]) for d in minibatch) < len(minibatch)  # both choices over the passes
    assert sum(0 < int(d.sum()) < 8 for d in caption) > len(caption) // 2  # mixed within most passes
    with raises_naming(ConfigError, "model.decoder.hard_expected_draw", "image"):
        LSTMDecoderConfig(attention="hard", hard_expected_draw="image")


def test_hard_attention_reinforce_gradient_reaches_attention():
    # with only sampled locations, the REINFORCE term must give the attention scorer a gradient
    torch.manual_seed(9)
    decoder = make_decoder(attention="hard", expected_prob=0.0).train()
    annotations, captions, lengths, image_index = make_batch()
    decoder.reward_baseline.fill_(-100.0)  # every reward beats the baseline
    output = decoder(annotations, captions, lengths, image_index)
    terms = hard_attention_loss(decoder, output, captions, penalty_weight=0.0, entropy_weight=0.0)
    (terms.total - terms.cross_entropy).backward()  # the REINFORCE part alone
    grads = [p.grad for p in decoder.attention.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_hard_attention_step_works_in_train_mode():
    # Self-critical training samples captions with ``rollout`` (decoder.step) in train mode: on a
    # fresh decoder (e.g. SCST resumed from a checkpoint) and after a teacher-forced batch of
    # fewer captions than the rollout has rows.
    torch.manual_seed(12)
    decoder = make_decoder(attention="hard").train()
    annotations = torch.randn(6, P, C)
    prepared, state = decoder.prepare(annotations), decoder.init_state(annotations)
    out = decoder.step(prepared, torch.full((6,), 1), state)  # before any forward
    assert out.log_probs.shape == (6, V) and torch.isfinite(out.log_probs).all()
    small_annotations, captions, lengths, _ = make_batch()  # 5 captions
    decoder(small_annotations, captions[:2], lengths[:2])
    out = decoder.step(prepared, torch.full((6,), 1), state)  # 6 rows after a forward over 2 captions
    assert out.log_probs.shape == (6, V) and torch.isfinite(out.log_probs).all()


def test_all_config_combinations_build():
    for attention, (scoring, activation), gate, deep in itertools.product(
        ["soft", "hard"], SCORINGS, ["scalar", "channel", "none"], [True, False]
    ):
        decoder = make_decoder(scoring, activation, attention, gate, deep)
        assert isinstance(decoder, HardAttentionDecoder) == (attention == "hard")
        assert decoder.vocab_size == V
        assert decoder.attention.num_heads == (HEADS if scoring == "multihead" else 1)


def test_step_returns_normalised_log_probs():
    torch.manual_seed(10)
    decoder = make_decoder(scoring="multihead").eval()
    annotations = torch.randn(3, P, C)
    out = decoder.step(decoder.prepare(annotations), torch.full((3,), 1), decoder.init_state(annotations))
    assert out.log_probs.shape == (3, V)
    torch.testing.assert_close(out.log_probs.exp().sum(1), torch.ones(3))
    assert out.alpha.shape == (3, P) and out.beta.shape == (3,)
    assert out.state.h.shape == (3, 24) and out.state.c.shape == (3, 24)
    torch.testing.assert_close(F.softmax(out.log_probs, 1), out.log_probs.exp())


@pytest.mark.slow
def test_compiled_step_gives_the_same_outputs():
    torch.manual_seed(0)
    decoder = ShowAttendTellDecoder.from_config(
        LSTMDecoderConfig(embed_dim=16, hidden_dim=32, attention_dim=16, dropout=0.0), 20, 8
    ).eval()
    annotations = torch.randn(3, 9, 8)
    captions = torch.randint(4, 20, (6, 7))
    captions[:, 0] = 1
    lengths = torch.tensor([7, 5, 3, 7, 6, 4])
    image_index = torch.tensor([0, 0, 1, 1, 2, 2])
    expected = decoder(annotations, captions, lengths, image_index).logits
    decoder.compile_step(backend="eager")  # dynamo tracing without the slow C++ code generation
    torch.testing.assert_close(decoder(annotations, captions, lengths, image_index).logits, expected)


# ----------------------------------------------------------------------------- the authors' variant
def authors_decoder(**changes) -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.3, **changes)
    return ShowAttendTellDecoder.from_config(config, V, C).eval()


def test_default_decoder_has_the_paper_s_one_layer_initial_state_and_no_output_tanh():
    decoder = authors_decoder()
    assert not any(key.startswith("init_mlp") for key in decoder.state_dict())  # checkpoints keep their keys
    annotations = torch.randn(3, P, C)
    mean = annotations.mean(1)
    torch.testing.assert_close(decoder.init_state(annotations).h, torch.tanh(decoder.init_h(mean)))


def test_two_layer_initial_state_as_the_authors_coco_script():
    decoder = authors_decoder(init_layers=2)
    extra = decoder.init_mlp[0][0]
    assert (extra.in_features, extra.out_features) == (C, C)  # C -> C, then the tanh layers C -> H
    annotations = torch.randn(3, P, C)
    hidden = torch.relu(extra(annotations.mean(1)))  # dropout is off in eval mode
    state = decoder.init_state(annotations)
    torch.testing.assert_close(state.h, torch.tanh(decoder.init_h(hidden)))
    torch.testing.assert_close(state.c, torch.tanh(decoder.init_c(hidden)))


def test_output_tanh_squashes_the_deep_output_before_the_output_layer():
    plain, squashed = authors_decoder(), authors_decoder(output_tanh=True)
    squashed.load_state_dict(plain.state_dict())  # same weights; only the tanh differs
    embedded, hidden, context = torch.randn(2, 8) * 3, torch.randn(2, 16), torch.randn(2, C)
    deep = embedded + plain.hidden_to_out(hidden) + plain.context_to_out(context)
    torch.testing.assert_close(plain._logits(embedded, hidden, context), plain.out(deep))
    torch.testing.assert_close(squashed._logits(embedded, hidden, context), plain.out(torch.tanh(deep)))


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"init_layers": 0}, ("model.decoder.init_layers", "[1, 16384]")),
        (
            {"output_tanh": True, "deep_output": False},
            ("model.decoder.output_tanh", "model.decoder.deep_output"),
        ),
        ({"kind": "transformer", "init_layers": 2}, ("model.decoder.init_layers", "lstm", "'transformer'")),
    ],
)
def test_authors_variant_keys_are_validated(changes, names):
    with raises_naming(ConfigError, *names):
        from_dict({"model": {"decoder": changes}})
