"""The attention LSTM decoder of Show, Attend and Tell (Xu et al. 2015), soft and hard attention.

One decoding step (section 3.1.2), with h_{t-1} the previous state and a the annotation grid:

    alpha_t = softmax(f_att(a, h_{t-1}))            attention over the P grid positions
    z_t     = beta_t * phi(alpha_t, a)              context; beta_t = sigmoid(f_beta(h_{t-1}))
    h_t, c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_t-1)
    p(y_t)  ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))   the deep output, equation 7

phi is the expectation under alpha_t (soft, section 4.2) or a location sampled from alpha_t
(hard, section 4.1). The teacher-forced ``forward`` keeps only work that depends on h_{t-1}
inside the time loop: the annotation projections are made once per image, and the embeddings,
their share of the LSTM gates and the output layer are computed for all steps at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.config import LSTMDecoderConfig
from captioning.models.attention import SCORERS, Attention, Prepared, build_attention
from captioning.models.base import CaptionDecoder, DecoderOutput, StepOutput, register_decoder

__all__ = ["DecoderOutput", "DecoderState", "HardAttentionDecoder", "ShowAttendTellDecoder", "StepOutput"]


class DecoderState(NamedTuple):
    """LSTM memory, (N, H) each."""

    h: Tensor
    c: Tensor

    def select(self, index: Tensor) -> DecoderState:
        return DecoderState(self.h.index_select(0, index), self.c.index_select(0, index))


# One recurrence step: the new state, context (N, D), alpha (N, P), beta (N,) or None, and with hard
# attention in training the sampled location's log-probability (N,) and alpha's entropy (N,).
CellOutput = tuple[DecoderState, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]


@register_decoder("lstm", LSTMDecoderConfig)
class ShowAttendTellDecoder(CaptionDecoder):
    """LSTM decoder with soft attention over a grid of annotation vectors.

    Args:
        vocab_size: V, including the special tokens.
        annotation_dim: C, channels of the encoder grid.
        attention: a scorer from ``captioning.models.attention`` (its ``context_dim`` is D).
        embed_dim: m, word embedding size.
        hidden_dim: H, LSTM size.
        gate: ``scalar`` (beta_t, the paper), ``channel`` (one gate per context channel) or ``none``.
        deep_output: equation 7 when True; a linear layer over dropout(h_t) when False.
        dropout: dropout before the output layer (and after each extra initial-state layer).
        init_layers: layers of the initial-state MLP: 1 (h_0 = tanh(W mean a), as the paper
            writes it) or more, each extra one a C -> C ReLU layer with dropout before the two
            tanh layers (the authors' COCO script uses 2).
        output_tanh: tanh over equation 7's sum before the output layer, as the authors' code
            does (the paper prints none); deep output only.
        hidden_dropout: dropout on h_t before L_h too, as the authors' code does; deep output only.
    """

    input_weight = "init_h.weight"

    def __init__(
        self,
        vocab_size: int,
        annotation_dim: int,
        attention: Attention,
        embed_dim: int = 512,
        hidden_dim: int = 512,
        gate: str = "scalar",
        deep_output: bool = True,
        dropout: float = 0.5,
        init_layers: int = 1,
        output_tanh: bool = False,
        hidden_dropout: bool = False,
    ):
        super().__init__()
        if (output_tanh or hidden_dropout) and not deep_output:
            raise ValueError("output_tanh and hidden_dropout need the deep output")
        self.vocab_size = vocab_size
        self.annotation_dim = annotation_dim
        self.hidden_dim = hidden_dim
        self.attention = attention
        self.attention_heads = attention.num_heads
        context_dim = attention.context_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        # Extra layers of the authors' initial-state MLP, shared by h_0 and c_0 (none by default).
        self.init_mlp = nn.Sequential(
            *[
                nn.Sequential(nn.Linear(annotation_dim, annotation_dim), nn.ReLU(), nn.Dropout(dropout))
                for _ in range(init_layers - 1)
            ]
        )
        self.init_h = nn.Linear(annotation_dim, hidden_dim)
        self.init_c = nn.Linear(annotation_dim, hidden_dim)
        gate_dims = {"scalar": 1, "channel": context_dim, "none": 0}
        self.gate = nn.Linear(hidden_dim, gate_dims[gate]) if gate_dims[gate] else None
        # LSTM gates (i, f, g, o): the embedding share is computed for all steps at once,
        # the context and recurrent shares in one product per step.
        self.embed_to_gates = nn.Linear(embed_dim, 4 * hidden_dim)
        self.recurrent_to_gates = nn.Linear(context_dim + hidden_dim, 4 * hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.deep_output = deep_output
        self.output_tanh = output_tanh
        self.hidden_dropout = hidden_dropout
        # The compiled recurrence step, once compile_step has made it.
        self._compiled_cell: Callable[[Tensor, Prepared, DecoderState], CellOutput] | None = None
        if deep_output:
            self.hidden_to_out = nn.Linear(hidden_dim, embed_dim)  # L_h
            self.context_to_out = nn.Linear(context_dim, embed_dim, bias=False)  # L_z
            self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        else:
            self.out = nn.Linear(hidden_dim, vocab_size)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        with torch.no_grad():  # forget-gate bias 1: remember by default early in training
            self.embed_to_gates.bias.zero_()
            self.embed_to_gates.bias[self.hidden_dim : 2 * self.hidden_dim].fill_(1.0)

    @classmethod
    def check_config(cls, config: LSTMDecoderConfig) -> None:
        """``model.decoder.scoring`` must name a registered scorer (``SCORERS``) that takes the
        configuration's sizes: the scorer is built once on the meta device (no memory), so the checks
        its builder makes (``multihead``: heads dividing ``attention_dim``) refuse a bad value before
        any work. Checks on the annotations' size wait for the encoder (``dot``)."""
        SCORERS.check(config.scoring)
        with torch.device("meta"):
            SCORERS[config.scoring](config.hidden_dim, config.hidden_dim, config)

    @classmethod
    def from_config(
        cls,
        config: LSTMDecoderConfig,
        vocab_size: int,
        annotation_dim: int,
        grid: tuple[int, int] | None = None,
    ) -> ShowAttendTellDecoder:
        """The decoder (soft or hard attention) described by ``config``; the grid does not matter."""
        kwargs: dict[str, Any] = {
            "vocab_size": vocab_size,
            "annotation_dim": annotation_dim,
            "attention": build_attention(config, annotation_dim),
            "embed_dim": config.embed_dim,
            "hidden_dim": config.hidden_dim,
            "gate": config.gate,
            "deep_output": config.deep_output,
            "dropout": config.dropout,
            "init_layers": config.init_layers,
            "output_tanh": config.output_tanh,
            "hidden_dropout": config.hidden_dropout,
        }
        if config.attention == "hard":
            return HardAttentionDecoder(
                **kwargs,
                expected_prob=config.hard_expected_prob,
                baseline_decay=config.hard_baseline_decay,
                expected_gradient=config.hard_alpha_gradients == "paper",
                expected_draw=config.hard_expected_draw,
            )
        return ShowAttendTellDecoder(**kwargs)

    def compile_step(self, backend: str = "inductor") -> None:
        """``torch.compile`` the recurrence step (attention, gate, LSTM cell), with dynamic batch sizes.

        The step is where the time goes and its shapes change only with the active batch, so it
        compiles to one fused kernel chain; the surrounding loop stays in Python. Worth it on
        GPU; on CPU the compilation (a minute or more) rarely pays for itself.
        """
        self._compiled_cell = torch.compile(self._cell, dynamic=True, backend=backend)

    # ----------------------------------------------------------------- per-image work, done once
    def prepare(self, annotations: Tensor) -> Prepared:
        """Attention projections of the annotations (B, P, C), once per image."""
        return self.attention.prepare(annotations)

    def init_state(self, annotations: Tensor) -> DecoderState:
        """h_0, c_0 = tanh(MLP(mean_i a_i)), each (B, H)."""
        mean = self.init_mlp(annotations.mean(dim=1))  # (B, C)
        return DecoderState(torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean)))

    # ----------------------------------------------------------------- the recurrence
    def _gate(self, h: Tensor) -> Tensor | None:
        return torch.sigmoid(self.gate(h)) if self.gate is not None else None  # (N, 1) or (N, D)

    def _context(self, weights: Tensor, prepared: Prepared) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Soft attention: z = E_alpha[values]. Returns (context (N, D), None, None)."""
        return self.attention.combine(weights, prepared), None, None

    def _cell(self, embed_gates: Tensor, prepared: Prepared, state: DecoderState) -> CellOutput:
        """One recurrence step for N rows; ``embed_gates`` (N, 4H) is the embedding share."""
        h, c = state
        weights = self.attention(prepared, h)  # (N, nh, P)
        context, location_log_prob, entropy = self._context(weights, prepared)  # (N, D)
        beta = self._gate(h)
        if beta is not None:
            context = beta * context
        gates = embed_gates + self.recurrent_to_gates(torch.cat([context, h], dim=1))  # (N, 4H)
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        head = self.attention_view.head
        alpha = weights.mean(dim=1) if head is None else weights[:, head]  # (N, P)
        beta_value = beta.mean(dim=1) if beta is not None else None  # (N,)
        return DecoderState(h, c), context, alpha, beta_value, location_log_prob, entropy

    def _logits(self, embedded: Tensor | None, hidden: Tensor, context: Tensor | None) -> Tensor:
        """Output layer over any leading shape: (..., m), (..., H), (..., D) -> (..., V).

        Only the deep output reads ``embedded`` and ``context``; they may be None without it.
        """
        if self.deep_output:
            hidden = self.dropout(hidden) if self.hidden_dropout else hidden
            deep = embedded + self.hidden_to_out(hidden) + self.context_to_out(context)  # (..., m)
            return self.out(self.dropout(torch.tanh(deep) if self.output_tanh else deep))
        return self.out(self.dropout(hidden))

    def step(self, prepared: Prepared, tokens: Tensor, state: DecoderState) -> StepOutput:
        """Advance N hypotheses by one word.

        Args:
            prepared: projections of the images of the N rows (``Prepared.group`` rows per image).
            tokens: (N,) the previous words y_{t-1}.
            state: (N, H) memory.
        Returns:
            log-probabilities of the next word (N, V), the new state, alpha_t (N, P), beta_t (N,), and
            with hard attention in training the log-probability of the sampled location (N,; 0 on
            rows that use the expected context), which a policy gradient over rollouts needs.
        """
        embedded = self.embedding(tokens)  # (N, m)
        state, context, alpha, beta, location_log_prob, _ = (self._compiled_cell or self._cell)(
            self.embed_to_gates(embedded), prepared, state
        )
        logits = self._logits(embedded, state.h, context)  # (N, V)
        logits = logits.float()
        return StepOutput(torch.log_softmax(logits, dim=-1), state, alpha, beta, location_log_prob, logits)

    def forward(
        self, annotations: Tensor, captions: Tensor, lengths: Tensor, image_index: Tensor | None = None
    ) -> DecoderOutput:
        """Teacher-forced decoding of N captions.

        Args:
            annotations: (B, P, C) the annotation grid of B images.
            captions: (N, L) token ids ``<start> w1 .. wn <end>`` padded with 0.
            lengths: (N,) tokens per caption including ``<start>`` and ``<end>``.
            image_index: (N,) the image row of each caption (several captions per image share
                one image's projections); None when N == B and caption i belongs to image i.
        Returns:
            ``DecoderOutput`` with T = max(lengths) - 1 steps, in the captions' order.
        """
        num_captions = captions.size(0)
        steps = int(lengths.max().item()) - 1
        decode_lengths = lengths - 1  # (N,) words to predict
        # Sort by length so the active rows at step t are a prefix: the batch shrinks as captions end.
        order = torch.argsort(decode_lengths, descending=True, stable=True)
        in_order = bool((order == torch.arange(num_captions, device=order.device)).all())
        if image_index is None:  # one image per caption: sort the grids, then project each once
            sorted_annotations = annotations if in_order else annotations.index_select(0, order)
            prepared = self.prepare(sorted_annotations)
            state = self.init_state(sorted_annotations)
        else:  # several captions per image: project each image once, then give every caption its rows
            rows = image_index if in_order else image_index.index_select(0, order)
            prepared = self.prepare(annotations).select(rows)
            state = self.init_state(annotations).select(rows)
        inputs = (captions if in_order else captions.index_select(0, order))[:, :steps]  # (N, T)
        embedded = self.embedding(inputs)  # (N, T, m)
        embed_gates = self.embed_to_gates(embedded).unbind(1)  # T x (N, 4H), all steps in one product
        active = (
            (decode_lengths.index_select(0, order).unsqueeze(1) > torch.arange(steps, device=captions.device))
            .sum(0)
            .tolist()
        )  # rows alive per step

        # Per-step results are collected and stacked once: writing each step into a preallocated
        # (N, T, ...) buffer would make backward copy the whole buffer once per step.
        # beta (with a gate) and the sampled locations (hard attention in training) come on every
        # step or on none.
        hiddens: list[Tensor] = []
        contexts: list[Tensor] = []
        alphas: list[Tensor] = []
        betas: list[Tensor] = []
        location_log_probs: list[Tensor] = []
        entropies: list[Tensor] = []
        cell = self._compiled_cell or self._cell
        for t, n in enumerate(active):
            if n < state.h.size(0):  # slice only when rows end: a no-op slice still costs a backward copy
                state, prepared = DecoderState(state.h[:n], state.c[:n]), prepared.head(n)
            state, context, alpha, beta, location_log_prob, entropy = cell(
                embed_gates[t][:n] if n < num_captions else embed_gates[t], prepared, state
            )
            hiddens.append(state.h)
            contexts.append(context)
            alphas.append(alpha)
            if beta is not None:
                betas.append(beta)
            if location_log_prob is not None and entropy is not None:
                location_log_probs.append(location_log_prob)
                entropies.append(entropy)

        sampled_locations = bool(location_log_probs)  # hard attention in training
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(num_captions, device=order.device)

        def unsort(x: Tensor) -> Tensor:
            return x if in_order else x.index_select(0, inverse)

        def padded(values: list[Tensor], *shape: int) -> Tensor:
            """(N, T, *shape) in the callers' order from per-step (n_t, *shape), zeros after each end."""
            return unsort(_stack_steps(values, num_captions, shape, embedded))

        # Unsorted before the output layer: (N, T, H) inputs are V/H times smaller than (N, T, V) logits.
        hidden_steps = padded(hiddens, self.hidden_dim)  # (N, T, H)
        if self.deep_output:
            logits = self._logits(
                unsort(embedded), hidden_steps, padded(contexts, self.attention.context_dim)
            )
        else:
            logits = self._logits(None, hidden_steps, None)  # (N, T, V), one product for all steps
        mask = decode_lengths.unsqueeze(1) > torch.arange(steps, device=captions.device)  # (N, T)
        return DecoderOutput(
            logits,
            padded(alphas, prepared.keys.shape[-2]),
            mask,
            padded(betas) if self.gate is not None else None,
            padded(location_log_probs) if sampled_locations else None,
            padded(entropies) if sampled_locations else None,
        )


def _stack_steps(values: list[Tensor], rows: int, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """Stack per-step values (n_t, *shape), n_t non-increasing, into (rows, T, *shape) padded with zeros.

    The result has the dtype of ``like`` (the step values may be lower precision under autocast).
    """
    if not values:
        return like.new_zeros(rows, 0, *shape)
    columns = [
        F.pad(value, (0, 0) * len(shape) + (0, rows - value.size(0))) if value.size(0) < rows else value
        for value in (value.to(like.dtype) for value in values)
    ]
    return torch.stack(columns, dim=1)


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
