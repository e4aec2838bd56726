"""The names of an export's graphs and how the decoder's tensors lie in them (no torch needed: the
writer, ``captioning.export.graphs``, and the reader, ``captioning.export.folder``, share them)."""

from __future__ import annotations

from dataclasses import dataclass

from captioning.hub.identity import EXPORT_GRAPH

ENCODER, PREPARE, INIT, STEP = (
    EXPORT_GRAPH,
    "decoder_prepare.onnx",
    "decoder_init.onnx",
    "decoder_step.onnx",
)
GRAPHS = (ENCODER, PREPARE, INIT, STEP)


@dataclass(frozen=True)
class StepLayout:
    """How the decoder's tensors lie in the graphs' inputs and outputs (stored in config.json).

    Attributes:
        prepared: the number of ``prepared_*`` tensors.
        state: the number of ``state_*`` tensors.
        beta: whether the step outputs ``beta`` (a decoder with a gate).
    """

    prepared: int
    state: int
    beta: bool

    def prepared_names(self) -> list[str]:
        return [f"prepared_{i}" for i in range(self.prepared)]

    def state_names(self, prefix: str = "state") -> list[str]:
        return [f"{prefix}_{i}" for i in range(self.state)]

    def step_outputs(self) -> list[str]:
        return ["logits", "alpha", *(["beta"] if self.beta else []), *self.state_names("next_state")]
