"""The choices a figure offers: upsampling modes, colour scales, file formats, and which of a
Transformer's attention maps (``--layer``, ``--head``) a figure shows."""

from __future__ import annotations

from captioning.models.base import AttentionView, CaptionDecoder
from captioning.utils.errors import InputError

MODES = ("bilinear", "gaussian")  # as in captioning.visualization.overlay
NORMALIZATIONS = ("figure", "absolute", "word")  # as in captioning.visualization.overlay
FORMATS = ("png", "pdf", "svg")  # as in captioning.visualization.figures


def attention_view(layer: str | int | None = None, head: str | int | None = None) -> AttentionView:
    """The map ``--layer N|mean`` and ``--head H|mean`` name.

    Numbers are 1-based; by default the last layer, mean of heads.

    Raises:
        ValueError: a value that is neither ``mean`` nor a positive whole number.
    """

    def index(name: str, value: str | int | None, default: int | None) -> int | None:
        if value is None:
            return default
        if str(value).strip().lower() == "mean":
            return None
        try:
            number = int(str(value))
        except ValueError:
            number = 0
        if number < 1:
            raise InputError(f"--{name} must be a {name} number (1, 2, ...) or mean, got {value!r}")
        return number - 1

    return AttentionView(index("layer", layer, -1), index("head", head, None))


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
