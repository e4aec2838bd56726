"""The self-critical reward: CIDEr-D of a caption with its end counted as a word.

Rennie et al. (2017, appendix E) found it crucial that the reward sees the end of the sentence,
and the self-critical framework appends its end token to every finished candidate and to every
reference, document frequencies included. Without it a caption cut mid-phrase ("a man riding a
wave on top of a") is not penalised for stopping there: its n-grams are all in the references,
and it can outscore the complete caption. With the end token, the n-grams ``of a <end>`` and
``a <end>`` match no reference, while ``surfboard <end>`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from captioning.evaluation.metrics import CiderDScorer

# The vocabulary's end token; the tokenizer keeps it whole, so no caption word is split into it.
END_WORD = "<end>"


class CiderDReward:
    """Per-caption CIDEr-D against a fixed corpus of references, as the self-critical reward.

    Document frequencies are computed once, from ``references``. With ``end_token`` (the default,
    as Rennie et al.), every reference and every finished caption ends with the word ``<end>``
    (a caption cut by the length limit has none, as in the self-critical framework); without it,
    captions and references are scored as they are (what earlier versions of this project did).

    Args:
        references: image id -> reference captions, each a list of words without ``<end>``.
        end_token: count the end of the caption as a word on both sides.
    Raises:
        EvaluationInputError: no references, or an image with none.
    """

    def __init__(self, references: Mapping[int, Sequence[Sequence[str]]], end_token: bool = True):
        self.end_token = end_token
        self._suffix = [END_WORD] if end_token else []
        self.scorer = CiderDScorer(
            {
                image_id: [[*words, *self._suffix] for words in captions]
                for image_id, captions in references.items()
            }
        )

    def __call__(
        self,
        image_ids: Sequence[int],
        captions: Sequence[Sequence[str]],
        finished: Sequence[bool] | None = None,
    ) -> np.ndarray:
        """CIDEr-D of each caption against its image's references.

        Args:
            image_ids: (N,) the image of each caption; repeats are fine (several samples per image).
            captions: (N,) word lists without ``<end>``.
            finished: (N,) whether each caption ended with ``<end>`` rather than at the length
                limit; None: all did.
        Returns:
            (N,) float64 rewards.
        Raises:
            KeyError: an image is not in the references.
            ValueError: the three sequences differ in length.
        """
        if finished is None:
            finished = [True] * len(captions)
        if len(finished) != len(captions):
            raise ValueError(f"{len(captions)} captions but {len(finished)} finished flags")
        scored = [
            [*words, *self._suffix] if done else list(words)
            for words, done in zip(captions, finished, strict=True)
        ]
        return self.scorer.scores(image_ids, scored)


__all__ = ["END_WORD", "CiderDReward"]
