"""What captioning one image returns to the user (``model.caption``): the words, where the model
looked for each, and the search's scores; NumPy arrays only, whichever runtime ran the networks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Caption:
    """One image's caption and where the model looked for each word.

    Attributes:
        text: the words joined by spaces (empty when the model ended at once).
        words: the T generated words, without ``<start>`` and ``<end>``.
        attention: (T, gh, gw) float32, each word's attention over the encoder's grid; every map
            sums to 1. For a Transformer, the map of the attention view asked for (by default the
            mean of the heads of the last layer; see ``attention_label``).
        beta: (T,) the gate value of each word (``model.decoder.gate``), or None without a gate.
        log_prob: the model's log-probability of the words and of ``<end>`` when reached.
        score: what the search ranked by (``log_prob`` after length normalisation).
        finished: whether ``<end>`` came within ``max_length`` words.
        attention_label: which map ``attention`` holds, in words (``layer 3 of 3, mean of 8 heads``);
            empty for a single map.
        alternatives: with ``decode.num_return`` n > 1, the image's next n - 1 distinct captions,
            ranked (this one is the first, the system's output); empty otherwise.
        missing: how many fewer captions than the n asked for the search found for this image
            (``ranked`` holds n - missing): sampling keeps distinct draws only and gives what it has
            after a few rounds, and diverse beam search's groups may end on the same captions; 0 when
            all n came (and on the alternatives).
    """

    text: str
    words: list[str]
    attention: np.ndarray
    beta: np.ndarray | None
    log_prob: float
    score: float
    finished: bool
    attention_label: str = ""
    alternatives: tuple[Caption, ...] = ()
    missing: int = 0

    @property
    def ranked(self) -> list[Caption]:
        """This caption and its ``alternatives``: the image's captions, best first."""
        return [self, *self.alternatives]
