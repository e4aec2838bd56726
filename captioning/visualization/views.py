"""The choices a figure offers: upsampling modes, colour scales, file formats, and which of a
Transformer's attention maps (``--layer``, ``--head``) a figure shows."""

from __future__ import annotations

from captioning.models.base import CaptionDecoder
from captioning.models.views import attention_view as attention_view  # the choice figures offer
from captioning.utils.errors import InputError

MODES = ("bilinear", "gaussian")  # as in captioning.visualization.overlay
NORMALIZATIONS = ("figure", "absolute", "word")  # as in captioning.visualization.overlay
FORMATS = ("png", "pdf", "svg")  # as in captioning.visualization.figures


def check_layer_choice(decoder: CaptionDecoder, kind: str, option: str, layer: str | int | None) -> None:
    """Refuse a layer named (``--layer``, ``layer=``) for a decoder whose attention has no layers to
    choose among (the LSTM's one attention): the user thinks of another model.

    Raises:
        InputError: naming the option, its value and the decoder family.
    """
    if layer is not None and not decoder.layered:
        raise InputError(
            f"{option} {layer!r}: model.decoder.kind {kind!r} has one attention, not layers to choose "
            f"among; leave {option} out (it chooses a Transformer's layer)"
        )
