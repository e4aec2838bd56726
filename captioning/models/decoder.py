"""The attention LSTM decoder of Show, Attend and Tell (Xu et al. 2015), soft and hard attention.

One decoding step (section 3.1.2), with h_{t-1} the previous state and a the annotation grid:

    alpha_t = softmax(f_att(a, h_{t-1}))            attention over the P grid positions
    z_t     = beta_t * phi(alpha_t, a)              context; beta_t = sigmoid(f_beta(h_{t-1}))
    h_t, c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_t-1)
    p(y_t)  ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))   the deep output, equation 7

phi is the expectation under alpha_t (soft, section 4.2) or a location sampled from alpha_t
(hard, section 4.1). What does not depend on the cell (attention, gate, output layer, the
teacher-forced loop) is ``captioning.models.recurrent.RecurrentDecoder``'s; this module gives it the
LSTM: its state (h, c), h_0 and c_0, and the cell.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from captioning.config import LSTMDecoderConfig
from captioning.models.attention import Prepared
from captioning.models.base import DecoderOutput, StepOutput, register_decoder
from captioning.models.recurrent import RecurrentDecoder

__all__ = ["DecoderOutput", "HardAttentionDecoder", "LSTMState", "ShowAttendTellDecoder", "StepOutput"]


class LSTMState(NamedTuple):
    """LSTM memory of N rows: the output h and the cell c, (N, H) each."""

    h: Tensor
    c: Tensor

    @property
    def hidden(self) -> Tensor:
        return self.h

    def select(self, index: Tensor) -> LSTMState:
        return LSTMState(self.h.index_select(0, index), self.c.index_select(0, index))

    def head(self, n: int) -> LSTMState:
        return LSTMState(self.h[:n], self.c[:n])


@register_decoder("lstm", LSTMDecoderConfig)
class ShowAttendTellDecoder(RecurrentDecoder):
    """LSTM decoder with soft attention over a grid of annotation vectors (the arguments are
    ``RecurrentDecoder``'s; H is the LSTM's size, and the initial-state MLP gives h_0 and c_0)."""

    input_weight = "init_h.weight"
    gate_blocks = 4  # i, f, g, o

    def _init_state_layers(self) -> None:
        self.init_h = nn.Linear(self.annotation_dim, self.hidden_dim)
        self.init_c = nn.Linear(self.annotation_dim, self.hidden_dim)

    def _recurrence_layers(self) -> None:
        # The context and recurrent shares of the gates, in one product per step.
        self.recurrent_to_gates = nn.Linear(
            self.attention.context_dim + self.hidden_dim, 4 * self.hidden_dim, bias=False
        )

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():  # forget-gate bias 1: remember by default early in training
            self.embed_to_gates.bias.zero_()
            self.embed_to_gates.bias[self.hidden_dim : 2 * self.hidden_dim].fill_(1.0)

    @classmethod
    def from_config(
        cls,
        config: LSTMDecoderConfig,
        vocab_size: int,
        annotation_dim: int,
        grid: tuple[int, int] | None = None,
    ) -> ShowAttendTellDecoder:
        """The decoder (soft or hard attention) described by ``config``; the grid does not matter. A
        subclass registered as a family of its own is built as itself (soft attention)."""
        kwargs: dict[str, Any] = cls.decoder_arguments(config, vocab_size, annotation_dim)
        if config.attention == "hard":
            return HardAttentionDecoder(
                **kwargs,
                expected_prob=config.hard_expected_prob,
                baseline_decay=config.hard_baseline_decay,
                expected_gradient=config.hard_alpha_gradients == "paper",
                expected_draw=config.hard_expected_draw,
            )
        return (ShowAttendTellDecoder if issubclass(cls, HardAttentionDecoder) else cls)(**kwargs)

    def init_state(self, annotations: Tensor) -> LSTMState:
        """h_0, c_0 = tanh(MLP(mean_i a_i)), each (B, H)."""
        mean = self._image_summary(annotations)  # (B, C)
        return LSTMState(torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean)))

    def _recur(self, embed_gates: Tensor, context: Tensor, state: LSTMState) -> LSTMState:
        """The LSTM cell: gates (i, f, g, o) from the embedding share (N, 4H) and [z_t; h_{t-1}]."""
        h, c = state
        gates = embed_gates + self.recurrent_to_gates(torch.cat([context, h], dim=1))  # (N, 4H)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return LSTMState(h, c)


class HardAttentionDecoder(ShowAttendTellDecoder):
    """Stochastic hard attention (section 4.1): z_t is the value at one location s_t ~ alpha_t.

    In training, each caption uses a sampled location at every step, except that with
    probability ``expected_prob`` a caption uses the expected context instead (the paper's
    variance reduction). ``expected_draw`` "caption" draws that choice for each caption (the paper);
    "minibatch" draws it once for every caption of the pass, as the authors' ``capgen.py`` draws its
    ``h_sampling_mask`` once per minibatch. Trained with the variational lower bound (equation 12):
    REINFORCE on the location log-probabilities with the caption's log-likelihood as reward, a moving-average
    baseline (the buffer ``reward_baseline``, saved in checkpoints) and an entropy bonus
    (``captioning.training.losses.hard_attention_loss``). Self-critical rollouts sample locations
    too and their log-probabilities join the policy gradient (``StepOutput.location_log_prob``).
    At inference the expected context is used.

    ``expected_gradient`` False keeps the expected context's gradient from reaching alpha_t, as in
    the authors' code, where ``known_grads`` sets the gradient on alpha to REINFORCE's and the
    entropy's alone (``model.decoder.hard_alpha_gradients: authors``).
    """

    objective = "hard_attention"
    reward_baseline: Tensor  # () buffer: the moving average of the rewards, NaN until the first step

    def __init__(
        self,
        *args,
        expected_prob: float = 0.5,
        baseline_decay: float = 0.9,
        expected_gradient: bool = True,
        expected_draw: str = "caption",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if expected_draw not in ("caption", "minibatch"):
            raise ValueError(f"expected_draw must be caption or minibatch, got {expected_draw!r}")
        self.expected_prob = expected_prob
        self.expected_draw = expected_draw
        self.expected_gradient = expected_gradient
        self.baseline_decay = baseline_decay
        self.register_buffer("reward_baseline", torch.full((), float("nan")))  # NaN until the first step
        self._use_expected: Tensor | None = None

    def prepare(self, annotations: Tensor) -> Prepared:
        """As the soft decoder's; also starts a new draw of which captions use the expected context.

        Every teacher-forced pass and every rollout begins here, so each gets fresh draws.
        """
        self._use_expected = None
        return super().prepare(annotations)

    def _context(self, weights: Tensor, prepared: Prepared) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if not self.training:
            return self.attention.combine(weights, prepared), None, None
        expected = self.attention.combine(weights if self.expected_gradient else weights.detach(), prepared)
        if self._use_expected is None or self._use_expected.numel() < weights.size(0):
            # At the first step after prepare() every row is active. The draws are i.i.d. per row
            # (or one for all), so the length-sorted order of the teacher-forced pass does not matter.
            draws = weights.size(0) if self.expected_draw == "caption" else 1
            drawn = torch.rand(draws, device=weights.device) < self.expected_prob  # (n,) or (1,)
            self._use_expected = drawn.expand(weights.size(0))  # (n,)
        alpha = weights.mean(dim=1)  # (n, P)
        location = torch.multinomial(alpha.detach().float(), 1).squeeze(1)  # (n,)
        one_hot = torch.zeros_like(weights).scatter_(
            2, location.view(-1, 1, 1).expand(-1, weights.size(1), 1), 1.0
        )
        sampled = self.attention.combine(one_hot, prepared)  # (n, D)
        use_expected = self._use_expected[: alpha.size(0)].unsqueeze(1)  # (n, 1)
        context = torch.where(use_expected, expected, sampled)
        log_alpha = torch.log(alpha.clamp_min(1e-12))
        location_log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)
        location_log_prob = location_log_prob.masked_fill(use_expected.squeeze(1), 0.0)
        entropy = -(alpha * log_alpha).sum(dim=1)  # (n,)
        return context, location_log_prob, entropy
