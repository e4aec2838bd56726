"""An attention decoder built around a recurrent cell, whatever the cell keeps between words.

Every step reads the previous output h_{t-1} of the recurrence (Xu et al. 2015, section 3.1.2):

    alpha_t = softmax(f_att(a, h_{t-1}))            attention over the P grid positions
    z_t     = beta_t * phi(alpha_t, a)              context; beta_t = sigmoid(f_beta(h_{t-1}))
    state_t = recur([E y_{t-1}; z_t], state_{t-1})  the cell: an LSTM's (h, c), a GRU's h, ...
    p(y_t)  ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))   the deep output, equation 7

``RecurrentDecoder`` holds what does not depend on the cell (the attention, the gate, the output
layer, the teacher-forced loop over a batch that shrinks as captions end); a family is a subclass
that says what its state is and how it advances (``init_state``, ``_recur``, and the layers they use
in ``_init_state_layers`` and ``_recurrence_layers``). The state is the cell's own object
(``RecurrentState``): the generic code reads its ``hidden`` output and moves its rows with
``select`` and ``head``, never its fields. ``captioning.models.decoder`` is the LSTM of the paper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.config import LSTMDecoderConfig
from captioning.models.attention import SCORERS, Attention, Prepared, build_attention
from captioning.models.base import CaptionDecoder, DecoderOutput, StepOutput

State = TypeVar("State", bound="RecurrentState")


class RecurrentState(Protocol):
    """What a recurrent cell carries from one word to the next for N rows.

    A ``NamedTuple`` of tensors with the rows on dim 0 (the ONNX export flattens its fields in order
    and rebuilds it with its class: ``captioning.export.graphs``), with these three members.
    """

    @property
    def hidden(self) -> Tensor:
        """(N, H) the cell's output h_t: what attention queries and the output layer reads."""
        ...

    def select(self: State, index: Tensor) -> State:
        """Rows ``index`` (M,): beam search's reordering, an image's rows repeated."""
        ...

    def head(self: State, n: int) -> State:
        """The first ``n`` rows (views): the active captions of a length-sorted batch."""
        ...


# One recurrence step: the new state, context (N, D), alpha (N, P), beta (N,) or None, and with hard
# attention in training the sampled location's log-probability (N,) and alpha's entropy (N,).
CellOutput = tuple[Any, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]


class RecurrentDecoder(CaptionDecoder):
    """Attention over a grid of annotation vectors, read by a recurrent cell a subclass defines.

    Args:
        vocab_size: V, including the special tokens.
        annotation_dim: C, channels of the encoder grid.
        attention: a scorer from ``captioning.models.attention`` (its ``context_dim`` is D).
        embed_dim: m, word embedding size.
        hidden_dim: H, the cell's output size.
        gate: ``scalar`` (beta_t, the paper), ``channel`` (one gate per context channel) or ``none``.
        deep_output: equation 7 when True; a linear layer over dropout(h_t) when False.
        dropout: dropout before the output layer (and after each extra initial-state layer).
        init_layers: layers of the initial-state MLP over the mean annotation: 1 (none before the
            cell's own initial-state layers, as the paper writes it) or more, each extra one a
            C -> C ReLU layer with dropout (the authors' COCO script uses 2).
        output_tanh: tanh over equation 7's sum before the output layer, as the authors' code
            does (the paper prints none); deep output only.
        hidden_dropout: dropout on h_t before L_h too, as the authors' code does; deep output only.

    A subclass sets ``gate_blocks`` (the H-wide blocks of the embedding's share of the cell's
    pre-activations, ``embed_to_gates``, computed for all steps at once: 4 for an LSTM's gates) and
    defines ``_init_state_layers`` and ``_recurrence_layers`` (its modules), ``init_state`` and
    ``_recur`` (one step of the cell).
    """

    gate_blocks: ClassVar[int]

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
        # Extra layers of the authors' initial-state MLP, shared by every tensor of the state.
        self.init_mlp = nn.Sequential(
            *[
                nn.Sequential(nn.Linear(annotation_dim, annotation_dim), nn.ReLU(), nn.Dropout(dropout))
                for _ in range(init_layers - 1)
            ]
        )
        self._init_state_layers()
        gate_dims = {"scalar": 1, "channel": context_dim, "none": 0}
        self.gate = nn.Linear(hidden_dim, gate_dims[gate]) if gate_dims[gate] else None
        # The embedding's share of the cell's pre-activations, for all steps in one product.
        self.embed_to_gates = nn.Linear(embed_dim, self.gate_blocks * hidden_dim)
        self._recurrence_layers()
        self.dropout = nn.Dropout(dropout)
        self.deep_output = deep_output
        self.output_tanh = output_tanh
        self.hidden_dropout = hidden_dropout
        # The compiled recurrence step, once compile_step has made it.
        self._compiled_cell: Callable[[Tensor, Prepared, Any], CellOutput] | None = None
        if deep_output:
            self.hidden_to_out = nn.Linear(hidden_dim, embed_dim)  # L_h
            self.context_to_out = nn.Linear(context_dim, embed_dim, bias=False)  # L_z
            self.out = nn.Linear(embed_dim, vocab_size)  # L_o
        else:
            self.out = nn.Linear(hidden_dim, vocab_size)
        self.reset_parameters()

    # ----------------------------------------------------------------- what a cell defines
    def _init_state_layers(self) -> None:
        """Make the modules ``init_state`` uses (read ``annotation_dim`` C and ``hidden_dim`` H)."""
        raise NotImplementedError

    def _recurrence_layers(self) -> None:
        """Make the modules ``_recur`` uses besides ``embed_to_gates`` (the context is
        ``attention.context_dim`` D wide)."""
        raise NotImplementedError

    def init_state(self, annotations: Tensor) -> RecurrentState:
        """The state before the first word, one row per image of (B, P, C)."""
        raise NotImplementedError

    def _recur(self, embed_gates: Tensor, context: Tensor, state: Any) -> RecurrentState:
        """One step of the cell for N rows: ``embed_gates`` (N, gate_blocks * H) the embedding's share,
        ``context`` (N, D) the gated context z_t, ``state`` the previous state -> the next state."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)

    def _image_summary(self, annotations: Tensor) -> Tensor:
        """(B, P, C) -> (B, C): the extra initial-state layers over the mean annotation."""
        return self.init_mlp(annotations.mean(dim=1))

    # ----------------------------------------------------------------- configuration
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
    def decoder_arguments(cls, config: LSTMDecoderConfig, vocab_size: int, annotation_dim: int) -> dict:
        """The constructor's arguments that ``config`` (the LSTM's options or a subclass of them)
        describes."""
        return {
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

    @classmethod
    def from_config(
        cls,
        config: LSTMDecoderConfig,
        vocab_size: int,
        annotation_dim: int,
        grid: tuple[int, int] | None = None,
    ) -> RecurrentDecoder:
        """The decoder ``config`` describes; the grid does not matter."""
        return cls(**cls.decoder_arguments(config, vocab_size, annotation_dim))

    def compile_step(self, backend: str = "inductor") -> None:
        """``torch.compile`` the recurrence step (attention, gate, cell), with dynamic batch sizes.

        The step is where the time goes and its shapes change only with the active batch, so it
        compiles to one fused kernel chain; the surrounding loop stays in Python. Worth it on
        GPU; on CPU the compilation (a minute or more) rarely pays for itself.
        """
        self._compiled_cell = torch.compile(self._cell, dynamic=True, backend=backend)

    # ----------------------------------------------------------------- per-image work, done once
    def prepare(self, annotations: Tensor) -> Prepared:
        """Attention projections of the annotations (B, P, C), once per image."""
        return self.attention.prepare(annotations)

    # ----------------------------------------------------------------- one step
    def _gate(self, h: Tensor) -> Tensor | None:
        return torch.sigmoid(self.gate(h)) if self.gate is not None else None  # (N, 1) or (N, D)

    def _context(self, weights: Tensor, prepared: Prepared) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Soft attention: z = E_alpha[values]. Returns (context (N, D), None, None)."""
        return self.attention.combine(weights, prepared), None, None

    def _cell(self, embed_gates: Tensor, prepared: Prepared, state: Any) -> CellOutput:
        """One recurrence step for N rows; ``embed_gates`` (N, gate_blocks * H) is the embedding share."""
        h = state.hidden  # (N, H)
        weights = self.attention(prepared, h)  # (N, nh, P)
        context, location_log_prob, entropy = self._context(weights, prepared)  # (N, D)
        beta = self._gate(h)
        if beta is not None:
            context = beta * context
        state = self._recur(embed_gates, context, state)
        head = self.attention_view.head
        alpha = weights.mean(dim=1) if head is None else weights[:, head]  # (N, P)
        beta_value = beta.mean(dim=1) if beta is not None else None  # (N,)
        return state, context, alpha, beta_value, location_log_prob, entropy

    def _logits(self, embedded: Tensor | None, hidden: Tensor, context: Tensor | None) -> Tensor:
        """Output layer over any leading shape: (..., m), (..., H), (..., D) -> (..., V).

        Only the deep output reads ``embedded`` and ``context``; they may be None without it.
        """
        if self.deep_output:
            hidden = self.dropout(hidden) if self.hidden_dropout else hidden
            deep = embedded + self.hidden_to_out(hidden) + self.context_to_out(context)  # (..., m)
            return self.out(self.dropout(torch.tanh(deep) if self.output_tanh else deep))
        return self.out(self.dropout(hidden))

    def step(self, prepared: Prepared, tokens: Tensor, state: Any) -> StepOutput:
        """Advance N hypotheses by one word.

        Args:
            prepared: projections of the images of the N rows (``Prepared.group`` rows per image).
            tokens: (N,) the previous words y_{t-1}.
            state: the cell's state of the N rows.
        Returns:
            log-probabilities of the next word (N, V), the new state, alpha_t (N, P), beta_t (N,), and
            with hard attention in training the log-probability of the sampled location (N,; 0 on
            rows that use the expected context), which a policy gradient over rollouts needs.
        """
        embedded = self.embedding(tokens)  # (N, m)
        state, context, alpha, beta, location_log_prob, _ = (self._compiled_cell or self._cell)(
            self.embed_to_gates(embedded), prepared, state
        )
        logits = self._logits(embedded, state.hidden, context)  # (N, V)
        logits = logits.float()
        return StepOutput(torch.log_softmax(logits, dim=-1), state, alpha, beta, location_log_prob, logits)

    # ----------------------------------------------------------------- teacher forcing
    def forward(
        self, annotations: Tensor, captions: Tensor, lengths: Tensor, image_index: Tensor | None = None
    ) -> DecoderOutput:
        """Teacher-forced decoding of N captions.

        Only work that depends on h_{t-1} runs inside the time loop: the annotation projections are
        made once per image, and the embeddings, their share of the cell's pre-activations and the
        output layer are computed for all steps at once.

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
        embed_gates = self.embed_to_gates(embedded).unbind(1)  # T x (N, G*H), all steps in one product
        active = (
            (decode_lengths.index_select(0, order).unsqueeze(1) > torch.arange(steps, device=captions.device))
            .sum(0)
            .tolist()
        )  # rows alive per step

        # Per-step results are collected and stacked once: writing each step into a preallocated
        # (N, T, ...) buffer would make backward copy the whole buffer once per step.
        values = _StepValues()
        cell = self._compiled_cell or self._cell
        for t, n in enumerate(active):
            # slice only when rows end: a no-op slice still costs a backward copy
            if n < state.hidden.size(0):
                state, prepared = state.head(n), prepared.head(n)
            state, context, alpha, beta, location_log_prob, entropy = cell(
                embed_gates[t][:n] if n < num_captions else embed_gates[t], prepared, state
            )
            values.add(state.hidden, context, alpha, beta, location_log_prob, entropy)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(num_captions, device=order.device)
        mask = decode_lengths.unsqueeze(1) > torch.arange(steps, device=captions.device)  # (N, T)
        return self._teacher_forced_output(
            values, None if in_order else inverse, embedded, mask, prepared.positions
        )

    def _teacher_forced_output(
        self, values: _StepValues, inverse: Tensor | None, embedded: Tensor, mask: Tensor, positions: int
    ) -> DecoderOutput:
        """The ``DecoderOutput`` of the per-step ``values`` of the length-sorted captions: padded to
        (N, T, ...), put back in the callers' order by ``inverse`` (None: already in it), and the output
        layer over all steps at once. ``embedded``: (N, T, m) sorted; ``mask``: (N, T) callers' order;
        ``positions``: P."""
        num_captions = mask.size(0)

        def unsort(x: Tensor) -> Tensor:
            return x if inverse is None else x.index_select(0, inverse)

        def padded(steps: list[Tensor], *shape: int) -> Tensor:
            """(N, T, *shape) in the callers' order from per-step (n_t, *shape), zeros after each end."""
            return unsort(_stack_steps(steps, num_captions, shape, embedded))

        # Unsorted before the output layer: (N, T, H) inputs are V/H times smaller than (N, T, V) logits.
        hidden_steps = padded(values.hiddens, self.hidden_dim)  # (N, T, H)
        if self.deep_output:
            logits = self._logits(
                unsort(embedded), hidden_steps, padded(values.contexts, self.attention.context_dim)
            )
        else:
            logits = self._logits(None, hidden_steps, None)  # (N, T, V), one product for all steps
        sampled_locations = bool(values.location_log_probs)  # hard attention in training
        return DecoderOutput(
            logits,
            padded(values.alphas, positions),
            mask,
            padded(values.betas) if self.gate is not None else None,
            padded(values.location_log_probs) if sampled_locations else None,
            padded(values.entropies) if sampled_locations else None,
        )


@dataclass
class _StepValues:
    """What each step of the teacher-forced loop gives, (n_t, ...) for the n_t captions still running.
    beta (with a gate) and the sampled locations (hard attention in training) come on every step or
    on none."""

    hiddens: list[Tensor] = field(default_factory=list)
    contexts: list[Tensor] = field(default_factory=list)
    alphas: list[Tensor] = field(default_factory=list)
    betas: list[Tensor] = field(default_factory=list)
    location_log_probs: list[Tensor] = field(default_factory=list)
    entropies: list[Tensor] = field(default_factory=list)

    def add(
        self,
        hidden: Tensor,
        context: Tensor,
        alpha: Tensor,
        beta: Tensor | None,
        location_log_prob: Tensor | None,
        entropy: Tensor | None,
    ) -> None:
        self.hiddens.append(hidden)
        self.contexts.append(context)
        self.alphas.append(alpha)
        if beta is not None:
            self.betas.append(beta)
        if location_log_prob is not None and entropy is not None:
            self.location_log_probs.append(location_log_prob)
            self.entropies.append(entropy)


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
