"""The contract every caption decoder keeps, so decoding, training and figures work with any of them.

A decoder (the attention LSTM of ``decoder.py``, the Transformer of ``transformer.py``) offers:

* ``prepare(annotations)``: the per-image work (projections, a grid encoder), once per image. The
  result has the images on dim 0, a ``group`` field (decoder rows per image, image-major) that
  ``NamedTuple._replace`` sets, ``select(index)``, ``head(n)`` and ``positions`` (P);
* ``init_state(annotations)``: the state of one row per image, an object the decoder defines (a
  ``NamedTuple`` of tensors with the rows on dim 0: an LSTM's (h, c), a GRU's h, a Transformer's
  caches); its ``select(index)`` reorders or repeats rows (beam search, sampling and self-critical
  rollouts move the state with it without knowing what it holds; a recurrent decoder's state also
  has ``head(n)`` and ``hidden``: ``captioning.models.recurrent``);
* ``step(prepared, tokens, state)`` -> ``StepOutput``: one word for N rows;
* ``forward(annotations, captions, lengths, image_index)`` -> ``DecoderOutput``: teacher forcing;
* ``set_attention_view(view)``: which attention map ``alpha`` reports (a layer and a head, or the
  mean over them) in ``step`` and ``forward``, for figures and grounding;
* ``from_config(config, vocab_size, annotation_dim, grid)``: the decoder its configuration describes.

A decoder family is registered with ``@register_decoder(kind, config_class)``, its class and its
options together: ``model.decoder.kind`` looks the family up in ``DECODERS`` (``captioning.config``),
its options are read into ``config_class`` and its decoder is built by the class. The training
objective is named by the class's ``objective`` (``captioning.training.losses.OBJECTIVES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

from torch import Tensor, nn

from captioning.config import DECODERS, DecoderConfig
from captioning.models.views import AttentionView as AttentionView  # its decoders report one
from captioning.utils.errors import InputError


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions and T = longest caption length - 1 steps.

    Step t predicts token t+1 of the caption from tokens 0..t; ``mask`` marks real steps.
    """

    logits: Tensor  # (N, T, V)
    alphas: Tensor  # (N, T, P), each real step's weights sum to 1 over P (the attention view's map)
    mask: Tensor  # (N, T) bool
    betas: Tensor | None = None  # (N, T) gate value (mean over channels for the channel gate)
    location_log_probs: Tensor | None = None  # (N, T) hard attention: log alpha of the sampled location
    entropies: Tensor | None = None  # (N, T) hard attention: entropy of alpha_t


class StepState(Protocol):
    """What a decoder carries from one step to the next for N rows (LSTM memory, attention caches).

    Decoding reorders or repeats it with ``select`` without knowing what it holds. It is a
    ``NamedTuple`` of tensors (or of tuples of tensors) with the rows on dim 0: the ONNX export
    flattens its fields in order and rebuilds it with its class (``captioning.export.graphs``).
    """

    def select(self, index: Tensor) -> StepState:
        """Rows ``index`` (M,) of the state: a state of M rows."""
        ...


class StepOutput(NamedTuple):
    """One decoding step for N running hypotheses."""

    log_probs: Tensor  # (N, V)
    state: StepState  # the decoder's state, with ``select(index)``
    alpha: Tensor  # (N, P)
    beta: Tensor | None  # (N,)
    location_log_prob: Tensor | None = (
        None  # (N,) hard attention in training: log alpha of the sampled location
    )
    # (N, V) the scores ``log_probs`` is the log-softmax of: greedy decoding and sampling apply the
    # repetition penalty to them (its sign rule reads their signs); None: a decoder that gives none.
    logits: Tensor | None = None


class CaptionDecoder(nn.Module):
    """Base class of the decoders: sizes, the attention view and the methods decoding calls.

    Subclasses set ``vocab_size``, ``annotation_dim``, ``attention_layers`` and ``attention_heads``
    and name in ``input_weight`` the parameter whose second dimension is the annotation size C
    (a checkpoint is checked against the encoder with it).
    """

    vocab_size: int
    annotation_dim: int
    attention_layers: int = 1
    attention_heads: int = 1
    # Whether its attention comes in layers that a view chooses among (a Transformer's); a decoder with
    # one attention (the LSTM's) refuses a layer that is named (captioning.visualization.views).
    layered: ClassVar[bool] = False
    input_weight: str
    # The training objective (a name in captioning.training.losses.OBJECTIVES) of teacher forcing.
    objective: ClassVar[str] = "cross_entropy"

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Refuse, before any work, what ``config`` names that no registry has (e.g. a scorer)."""

    @classmethod
    def from_config(
        cls, config: Any, vocab_size: int, annotation_dim: int, grid: tuple[int, int]
    ) -> CaptionDecoder:
        """The decoder ``config`` (an instance of the family's configuration class) describes, for V
        words and a (gh, gw) grid of C-channel annotations."""
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.attention_view = AttentionView()

    def set_attention_view(self, view: AttentionView) -> None:
        """Report ``view``'s map as ``alpha`` from now on.

        Raises:
            ValueError: a layer or head this decoder does not have.
        """
        for name, index, count in (
            ("layer", view.layer, self.attention_layers),
            ("head", view.head, self.attention_heads),
        ):
            if index is not None and not -count <= index < count:
                raise InputError(
                    f"attention {name} {index + 1 if index >= 0 else index} does not exist: "
                    f"the decoder has {count} {name}{'s' if count > 1 else ''}"
                )
        self.attention_view = view

    def describe_attention(self) -> str:
        """What the reported ``alpha`` is, in words (figure titles)."""
        return self.attention_view.describe(self.attention_layers, self.attention_heads)

    def compile_step(self, backend: str = "inductor") -> None:
        """``torch.compile`` the per-step work; subclasses say what that is."""
        raise NotImplementedError

    def prepare(self, annotations: Tensor):
        """Per-image work on the annotations (B, P, C), once per image."""
        raise NotImplementedError

    def init_state(self, annotations: Tensor) -> StepState:
        """The state before the first word, one row per image of (B, P, C)."""
        raise NotImplementedError

    def step(self, prepared, tokens: Tensor, state) -> StepOutput:
        """Advance N rows (tokens (N,), the previous words) by one word."""
        raise NotImplementedError


DecoderClass = TypeVar("DecoderClass", bound=type[CaptionDecoder])


def register_decoder(kind: str, config_class: type[DecoderConfig]) -> Callable[[DecoderClass], DecoderClass]:
    """Decorator registering a ``CaptionDecoder`` subclass as the decoder family ``kind`` of ``DECODERS``,
    configured by ``config_class`` (a frozen dataclass deriving from ``DecoderConfig`` whose ``kind``
    defaults to ``kind``): ``model.decoder.*`` is read into it. The built-in families' configuration
    classes are registered where configurations are read (``captioning.config``); their decoders join
    them here.

    Raises:
        ValueError: ``kind`` is taken, or is configured by another class already, or ``config_class``
            is not a dataclass of its kind.
    """
    return DECODERS.register_family(kind, config_class)


def decoder_class(kind: str) -> type[CaptionDecoder]:
    """The decoder class of the family ``kind``.

    Raises:
        UnknownNameError: one line naming ``model.decoder.kind`` and listing the registered families.
    """
    decoder: type[CaptionDecoder] = DECODERS.implementation_of(kind)
    return decoder
