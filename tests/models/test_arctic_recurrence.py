"""configs/coco_arctic.yaml builds the authors' COCO model: on shared weights its probabilities and
attention equal the recurrence of their ``capgen.py`` (soft attention, test time), written here from
their equations:

    pctx      = tanh((a Wc_att + b_att) W_att_1 + b_att_1)                 n_layers_att = 2
    h0, c0    = tanh(m W_state + b_state), tanh(m W_memory + b_memory),
                m = 0.5 relu(mean(a) W_init_1 + b_init_1)                  n_layers_init = 2
    alpha_t   = softmax(tanh(pctx + h_{t-1} Wd_att) U_att + c_tt)
    z_t       = sigmoid(h_{t-1} W_sel + b_sel) * sum_i alpha_ti a_i        selector
    i, f, o, g = split(h_{t-1} U + y_{t-1} W + b + z_t Wc)               their gate order
    c_t, h_t  = f c_{t-1} + i tanh(g), o tanh(c_t)
    p_t       = softmax(0.5 tanh(0.5 h_t W_lstm + b_lstm + y_{t-1} + z_t W_ctx + b_ctx) W_logit + b_logit)

with y_{t-1} the previous word's embedding (zeros at the first step) and the factors 0.5 their
Theano dropout at test time (it scales by 0.5 there; torch's scales by 2 in training, so the same
model has those factors in the weights after each dropout).
"""

from __future__ import annotations

import pytest
import torch
from tool_runs import REPO

from captioning.config import LSTMDecoderConfig
from captioning.config.loading import load_config
from captioning.data.vocab import Vocabulary
from captioning.models.decoder import ShowAttendTellDecoder

VOCAB, IMAGES, STEPS, POSITIONS = 40, 2, 5, 196


def authors_weights(config, channels: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Their parameters, named as capgen.py names them, small random values."""
    m, h, a = config.embed_dim, config.hidden_dim, config.attention_dim
    shapes = {
        "Wemb": (VOCAB, m),
        "ff_init_1_W": (channels, channels),
        "ff_init_1_b": (channels,),
        "ff_state_W": (channels, h),
        "ff_state_b": (h,),
        "ff_memory_W": (channels, h),
        "ff_memory_b": (h,),
        "Wc_att": (channels, a),
        "b_att": (a,),
        "W_att_1": (a, a),
        "b_att_1": (a,),
        "Wd_att": (h, a),
        "U_att": (a, 1),
        "c_tt": (1,),
        "W_sel": (h, 1),
        "b_sel": (1,),
        "W": (m, 4 * h),
        "b": (4 * h,),
        "U": (h, 4 * h),
        "Wc": (channels, 4 * h),
        "ff_logit_lstm_W": (h, m),
        "ff_logit_lstm_b": (m,),
        "ff_logit_ctx_W": (channels, m),
        "ff_logit_ctx_b": (m,),
        "ff_logit_W": (m, VOCAB),
        "ff_logit_b": (VOCAB,),
    }
    return {
        name: torch.randn(*shape, generator=generator, dtype=torch.float64) * 0.05
        for name, shape in shapes.items()
    }


def authors_recurrence(weights, annotations, captions):
    """Their test-time recurrence for (N, P, C) annotations and (N, L) captions: probabilities (N, T, V)
    and attention (N, T, P), T = L - 1, every caption as long as the longest (one length per batch)."""
    w = weights
    hidden = w["U"].shape[0]
    mean = 0.5 * torch.relu(annotations.mean(1) @ w["ff_init_1_W"] + w["ff_init_1_b"])
    h = torch.tanh(mean @ w["ff_state_W"] + w["ff_state_b"])
    c = torch.tanh(mean @ w["ff_memory_W"] + w["ff_memory_b"])
    pctx = torch.tanh((annotations @ w["Wc_att"] + w["b_att"]) @ w["W_att_1"] + w["b_att_1"])  # (N, P, A)
    probabilities, alphas = [], []
    for t in range(captions.size(1) - 1):
        previous = w["Wemb"][captions[:, t]] if t > 0 else torch.zeros_like(w["Wemb"][captions[:, 0]])
        scores = (torch.tanh(pctx + (h @ w["Wd_att"])[:, None, :]) @ w["U_att"]).squeeze(-1) + w["c_tt"]
        alpha = torch.softmax(scores, dim=-1)  # (N, P)
        context = torch.sigmoid(h @ w["W_sel"] + w["b_sel"]) * (alpha[:, :, None] * annotations).sum(1)
        preact = h @ w["U"] + previous @ w["W"] + w["b"] + context @ w["Wc"]
        i, f, o, g = (preact[:, k * hidden : (k + 1) * hidden] for k in range(4))
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        logit = (0.5 * h) @ w["ff_logit_lstm_W"] + w["ff_logit_lstm_b"] + previous
        logit = logit + context @ w["ff_logit_ctx_W"] + w["ff_logit_ctx_b"]
        logit = (0.5 * torch.tanh(logit)) @ w["ff_logit_W"] + w["ff_logit_b"]
        probabilities.append(torch.softmax(logit, dim=-1))
        alphas.append(alpha)
    return torch.stack(probabilities, 1), torch.stack(alphas, 1)


def load_authors_weights(decoder: ShowAttendTellDecoder, w: dict[str, torch.Tensor]) -> None:
    """Their parameters into this decoder: transposed (torch's Linear is x W^T), gates reordered from
    their (i, f, o, g) to (i, f, g, o), the biases of L_h and L_z summed, their test-time 0.5 moved
    into the weights after each dropout, and the <start> embedding zero (their first input)."""
    hidden = w["U"].shape[0]

    def gates(x: torch.Tensor) -> torch.Tensor:  # (..., 4H) in their order -> ours
        i, f, o, g = x.split(hidden, dim=-1)
        return torch.cat([i, f, g, o], dim=-1)

    attention = decoder.attention
    with torch.no_grad():
        pairs = [
            (decoder.embedding.weight, w["Wemb"]),
            (decoder.init_mlp[0][0].weight, w["ff_init_1_W"].T),
            (decoder.init_mlp[0][0].bias, w["ff_init_1_b"]),
            (decoder.init_h.weight, 0.5 * w["ff_state_W"].T),
            (decoder.init_h.bias, w["ff_state_b"]),
            (decoder.init_c.weight, 0.5 * w["ff_memory_W"].T),
            (decoder.init_c.bias, w["ff_memory_b"]),
            (attention.annotation_proj.weight, w["Wc_att"].T),
            (attention.annotation_proj.bias, w["b_att"]),
            (attention.annotation_layers[0][0].weight, w["W_att_1"].T),
            (attention.annotation_layers[0][0].bias, w["b_att_1"]),
            (attention.query_proj.weight, w["Wd_att"].T),
            (attention.score.weight, w["U_att"].T),  # c_tt: a constant under the softmax
            (decoder.gate.weight, w["W_sel"].T),
            (decoder.gate.bias, w["b_sel"]),
            (decoder.embed_to_gates.weight, gates(w["W"]).T),
            (decoder.embed_to_gates.bias, gates(w["b"])),
            (decoder.recurrent_to_gates.weight, gates(torch.cat([w["Wc"], w["U"]])).T),
            (decoder.hidden_to_out.weight, 0.5 * w["ff_logit_lstm_W"].T),
            (decoder.hidden_to_out.bias, w["ff_logit_lstm_b"] + w["ff_logit_ctx_b"]),
            (decoder.context_to_out.weight, w["ff_logit_ctx_W"].T),
            (decoder.out.weight, 0.5 * w["ff_logit_W"].T),
            (decoder.out.bias, w["ff_logit_b"]),
        ]
        for ours, theirs in pairs:
            assert ours.shape == theirs.shape
            ours.copy_(theirs)
        decoder.embedding.weight[Vocabulary.start_id] = 0.0
    # every parameter set: theirs less c_tt and the L_z bias (summed into L_h's)
    ours = sum(p.numel() for p in decoder.parameters())
    assert ours == sum(t.numel() for t in w.values()) - 1 - w["ff_logit_ctx_b"].numel()


def arctic_decoder() -> tuple[ShowAttendTellDecoder, object]:
    config = load_config(REPO / "configs" / "coco_arctic.yaml")
    assert (config.model.encoder.name, config.model.encoder.grid_size) == ("vgg19", 14)  # 196 x 512
    decoder = ShowAttendTellDecoder.from_config(config.model.decoder, vocab_size=VOCAB, annotation_dim=512)
    return decoder.double().eval(), config.model.decoder


@pytest.mark.slow  # the authors' sizes: 25 M parameters in float64, about 8 s on a busy 2-core machine
def test_the_arctic_configuration_equals_the_authors_recurrence_on_shared_weights():
    decoder, config = arctic_decoder()
    generator = torch.Generator().manual_seed(0)
    weights = authors_weights(config, 512, generator)
    load_authors_weights(decoder, weights)
    annotations = torch.rand(IMAGES, POSITIONS, 512, generator=generator, dtype=torch.float64)
    captions = torch.randint(Vocabulary.start_id + 2, VOCAB, (IMAGES, STEPS + 1), generator=generator)
    captions[:, 0] = Vocabulary.start_id
    probabilities, alphas = authors_recurrence(weights, annotations, captions)
    with torch.no_grad():
        output = decoder(annotations, captions, torch.full((IMAGES,), STEPS + 1))
    assert torch.allclose(torch.softmax(output.logits, -1), probabilities, rtol=0, atol=1e-6)
    assert torch.allclose(output.alphas, alphas, rtol=0, atol=1e-6)
    # the check can fail: without the extra attention layer the attention moves
    decoder.attention.annotation_layers = torch.nn.Sequential()
    with torch.no_grad():
        assert not torch.allclose(
            decoder(annotations, captions, torch.full((IMAGES,), STEPS + 1)).alphas, alphas
        )


def test_hidden_dropout_drops_h_before_l_h_in_training():
    decoder, _ = arctic_decoder()
    seen = []
    decoder.hidden_to_out.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    decoder.train()
    hidden = torch.ones(64, decoder.hidden_dim, dtype=torch.float64)
    decoder._logits(
        torch.zeros(64, 512, dtype=torch.float64), hidden, torch.zeros(64, 512, dtype=torch.float64)
    )
    values = seen[0].unique().tolist()
    assert values == [0.0, 2.0]  # p = 0.5, inverted dropout
    decoder.eval()
    decoder._logits(
        torch.zeros(1, 512, dtype=torch.float64), hidden[:1], torch.zeros(1, 512, dtype=torch.float64)
    )
    assert seen[1].unique().tolist() == [1.0]


@pytest.mark.parametrize("gradients", ["paper", "authors"])
def test_under_the_authors_hard_attention_the_expected_context_sends_alpha_no_gradient(gradients):
    config = LSTMDecoderConfig(
        attention="hard",
        embed_dim=8,
        hidden_dim=8,
        attention_dim=8,
        hard_expected_prob=1.0,  # every caption uses the expected context: no sampled location
        hard_alpha_gradients=gradients,
    )
    decoder = ShowAttendTellDecoder.from_config(config, vocab_size=VOCAB, annotation_dim=6).train()
    generator = torch.Generator().manual_seed(1)
    captions = torch.randint(Vocabulary.start_id + 2, VOCAB, (3, 5), generator=generator)
    captions[:, 0] = Vocabulary.start_id
    output = decoder(torch.rand(3, 9, 6, generator=generator), captions, torch.full((3,), 5))
    output.logits.sum().backward()
    score_gradient = decoder.attention.score.weight.grad  # reaches it only through alpha
    if gradients == "paper":
        assert score_gradient is not None and score_gradient.abs().sum() > 0
    else:
        assert score_gradient is None or score_gradient.abs().sum() == 0
    assert decoder.embedding.weight.grad is not None and decoder.embedding.weight.grad.abs().sum() > 0
