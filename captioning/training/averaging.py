"""An exponential moving average of a model's trainable weights (``train.ema_decay``; Polyak averaging).

After every optimisation step the average moves towards the weights by ``1 - d``, with
``d = min(ema_decay, (1 + n) / (10 + n))`` after ``n`` updates: the short horizon of the first
steps keeps the random initial weights from weighing on the average for thousands of steps. The
averaged weights are the ones validation scores and every checkpoint's weights hold; the weights
the optimiser moves are kept beside them in ``last.pt`` to resume.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def trainable_parameters(modules: dict[str, nn.Module]) -> dict[str, nn.Parameter]:
    """The trainable parameters of ``modules`` by ``<module name>.<parameter name>``."""
    return {
        f"{prefix}.{name}": parameter
        for prefix, module in modules.items()
        for name, parameter in module.named_parameters()
        if parameter.requires_grad
    }


class WeightAverage:
    """The average of ``parameters`` (by name); :meth:`applied` puts it in the model for a while.

    Args:
        parameters: the trainable parameters by name (:func:`trainable_parameters`).
        decay: the decay of the average once past its warm-up, in (0, 1).
    """

    def __init__(self, parameters: dict[str, nn.Parameter], decay: float) -> None:
        self.parameters = parameters
        self.decay = decay
        self.updates = 0
        self._weights = [p.detach() for p in parameters.values()]  # aligned with _averages, for every step
        self._set_average({name: p.detach().clone() for name, p in parameters.items()})
        self._optimised: dict[str, torch.Tensor] | None = None  # the optimiser's weights while applied

    def _set_average(self, average: dict[str, torch.Tensor]) -> None:
        self.average = average
        self._averages = [average[name] for name in self.parameters]

    def reset(self) -> None:
        """Start again from the weights as they are (a new training stage)."""
        self.updates = 0
        self._set_average({name: p.detach().clone() for name, p in self.parameters.items()})

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the weights after an optimisation step."""
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self._averages, self._weights, 1.0 - decay)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the model inside the block, the optimiser's again after it
        (re-entrant: an inner block changes nothing)."""
        if self._optimised is not None:
            yield
            return
        self._optimised = {name: p.detach().clone() for name, p in self.parameters.items()}
        try:
            with torch.no_grad():
                for name, parameter in self.parameters.items():
                    parameter.copy_(self.average[name])
            yield
        finally:
            with torch.no_grad():
                for name, parameter in self.parameters.items():
                    parameter.copy_(self._optimised[name])
            self._optimised = None

    def state_dict(self) -> dict:
        """What ``last.pt`` keeps beside the averaged weights: the optimiser's weights and the count."""
        optimised = self._optimised or {name: p.detach() for name, p in self.parameters.items()}
        return {"updates": self.updates, "optimised": {name: t.clone() for name, t in optimised.items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Resume: the model holds the checkpoint's (averaged) weights; take them as the average and
        put the optimiser's weights from ``state`` back into the model. ``state`` was checked before
        any work (``resume_state.check_average_state``)."""
        self.updates = state["updates"]
        self._set_average({name: p.detach().clone() for name, p in self.parameters.items()})
        for name, parameter in self.parameters.items():
            parameter.copy_(state["optimised"][name])
