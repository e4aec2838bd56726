"""A GRU decoder family whose state is one tensor, as docs/extending.md writes it: a small subclass of
``RecurrentDecoder`` (its state, h_0, the cell) and an options class. Nothing registers it on import:
a test registers it for its own block (``DECODERS.registered("gru", GRUDecoder, GRUDecoderConfig)``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from captioning.config import ConfigError, LSTMDecoderConfig
from captioning.models.recurrent import RecurrentDecoder


class GRUState(NamedTuple):
    """The GRU's memory of N rows: its output h (N, H), and nothing else."""

    h: Tensor

    @property
    def hidden(self) -> Tensor:
        return self.h

    def select(self, index: Tensor) -> GRUState:
        return GRUState(self.h.index_select(0, index))

    def head(self, n: int) -> GRUState:
        return GRUState(self.h[:n])


@dataclass(frozen=True)
class GRUDecoderConfig(LSTMDecoderConfig):
    """The LSTM's options (scorer, sizes, gate, deep output), with a GRU for the cell; soft attention."""

    kind: str = "gru"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention != "soft":
            raise ConfigError(f"model.decoder.attention must be soft for kind gru, got {self.attention!r}")


class GRUDecoder(RecurrentDecoder):
    """h_t = GRU([E y_{t-1}; z_t], h_{t-1}) with PyTorch's ``GRUCell`` gates (r, u, n), h_0 =
    tanh(W mean a)."""

    input_weight = "init_h.weight"
    gate_blocks = 3  # reset, update, candidate

    def _init_state_layers(self) -> None:
        self.init_h = nn.Linear(self.annotation_dim, self.hidden_dim)

    def _recurrence_layers(self) -> None:
        self.context_to_gates = nn.Linear(self.attention.context_dim, 3 * self.hidden_dim, bias=False)
        self.hidden_to_gates = nn.Linear(self.hidden_dim, 3 * self.hidden_dim)

    def init_state(self, annotations: Tensor) -> GRUState:
        return GRUState(torch.tanh(self.init_h(self._image_summary(annotations))))  # (B, H)

    def _recur(self, embed_gates: Tensor, context: Tensor, state: GRUState) -> GRUState:
        from_input = (embed_gates + self.context_to_gates(context)).chunk(3, dim=1)  # 3 x (N, H)
        from_hidden = self.hidden_to_gates(state.h).chunk(3, dim=1)
        reset = torch.sigmoid(from_input[0] + from_hidden[0])
        update = torch.sigmoid(from_input[1] + from_hidden[1])
        candidate = torch.tanh(from_input[2] + reset * from_hidden[2])
        return GRUState((1 - update) * candidate + update * state.h)
