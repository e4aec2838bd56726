"""Which of a decoder's attention maps is reported (``AttentionView``), and the ``--layer`` and
``--head`` choices that name one; no torch needed (an ONNX export reports its view too)."""

from __future__ import annotations

from dataclasses import dataclass

from captioning.utils.errors import InputError


@dataclass(frozen=True)
class AttentionView:
    """Which attention map a decoder reports: a layer and a head (0-based), None meaning the mean over them.

    The default, the mean over the heads of the last layer, is the map the losses and the
    figures use unless told otherwise.
    """

    layer: int | None = -1
    head: int | None = None

    def describe(self, layers: int, heads: int) -> str:
        """Words for a figure, e.g. ``layer 3 of 3, mean of 8 heads``; empty with one layer of one head."""
        layer = (
            f"mean of {layers} layers"
            if self.layer is None
            else f"layer {self.layer % layers + 1} of {layers}"
        )
        head = f"mean of {heads} heads" if self.head is None else f"head {self.head + 1} of {heads}"
        return ", ".join(([layer] if layers > 1 else []) + ([head] if heads > 1 else []))


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
