"""The trainer's Adam: fused where torch has the kernel, the same update as the loop implementation."""

from __future__ import annotations

import copy

import pytest
import torch

from captioning.config import Config, LSTMDecoderConfig
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.training.optim import adam, optimizer_for


class _Model(torch.nn.Module):
    """What ``optimizer_for`` reads: a decoder and a (frozen) encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = ShowAttendTellDecoder.from_config(
            LSTMDecoderConfig(embed_dim=16, hidden_dim=32, attention_dim=16), 40, 24
        )
        self.encoder = torch.nn.Linear(3, 3).requires_grad_(False)


@pytest.mark.slow
def test_the_trainers_adam_is_fused_on_cpu_and_steps_as_the_loop_implementation():
    torch.manual_seed(0)
    model = _Model()
    fused = optimizer_for(model, 1e-3, 1e-4, Config())
    assert fused.defaults["fused"] is True
    reference_model = copy.deepcopy(model)
    reference = torch.optim.Adam(
        reference_model.decoder.parameters(), lr=1e-3, betas=(0.9, 0.999), foreach=False
    )
    for step in range(20):
        for side in (model, reference_model):
            for number, parameter in enumerate(side.decoder.parameters()):
                parameter.grad = torch.sin(parameter.detach() * (step + 1) + number)  # the same on both sides
        fused.step()
        reference.step()
    for parameter, expected in zip(
        model.decoder.parameters(), reference_model.decoder.parameters(), strict=True
    ):
        torch.testing.assert_close(parameter, expected, rtol=1e-5, atol=1e-6)


def test_adam_takes_parameters_or_groups():
    weights = [torch.nn.Parameter(torch.ones(3))]
    assert adam(weights, lr=0.1).param_groups[0]["params"] == weights
    groups = adam([{"params": weights, "lr": 0.5}], lr=0.1).param_groups
    assert groups[0]["lr"] == 0.5
