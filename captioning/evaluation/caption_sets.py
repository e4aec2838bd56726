"""Oracle and diversity measures of several captions per image (``decode.num_return`` > 1).

Papers on diverse captioning report, for the n captions a system gives each image:

- ``oracle CIDEr-D``: the best CIDEr-D among an image's n captions, averaged over images (what
  the set would score if a perfect judge picked one caption per image). Each caption is scored
  as pycocoevalcap's ``Cider`` scores it, against its image's references, with document
  frequencies from the references of the images scored (:class:`CiderDScorer`).
- ``distinct-1``, ``distinct-2``: Li et al. 2016's distinct-n, over the corpus: the distinct words
  (bigrams) of all the captions of all images divided by the number of words in them (their
  paper scales by the total number of generated tokens; some implementations divide by the number
  of n-grams instead, which changes distinct-2 slightly).
- ``distinct-1 per set``, ``distinct-2 per set``: the same within each image's set, averaged over
  the images with words (a caption repeated across images lowers the corpus number, not this one).
- ``mBLEU-4``: each caption's BLEU-4 (pycocoevalcap) against the other captions of its image,
  averaged over the captions of an image and then over images with two or more captions (Shetty
  et al. 2017); lower means more diverse.

Captions are tokenized as the metrics tokenize them without Java (``data.tokenizer``'s tokenizer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu

from captioning.data.tokenizers import tokenizer_for
from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.metrics import CiderDScorer
from captioning.models.decoding import SAMPLE_ROUNDS


def distinct_ngrams(captions: Sequence[Sequence[str]], n: int) -> float | None:
    """Distinct n-grams of ``captions`` (tokenized) over their number of words; None without words."""
    words = sum(len(caption) for caption in captions)
    if not words:
        return None
    grams = {tuple(caption[i : i + n]) for caption in captions for i in range(len(caption) - n + 1)}
    return len(grams) / words


def mutual_bleu(captions: Sequence[Sequence[str]]) -> float | None:
    """The mean BLEU-4 of each caption (tokenized) against the others; None for fewer than two."""
    if len(captions) < 2:
        return None
    joined = [" ".join(caption) for caption in captions]
    gts = {k: [other for j, other in enumerate(joined) if j != k] for k in range(len(joined))}
    res = {k: [caption] for k, caption in enumerate(joined)}
    _, per_caption = Bleu(4).compute_score(gts, res, verbose=0)
    return float(np.mean(per_caption[3]))


def caption_set_measures(
    caption_sets: Mapping[int, Sequence[str]],
    references: Mapping[int, Sequence[str]] | None = None,
    tokenizer: str = "ptb",
) -> dict[str, float | None]:
    """The oracle and diversity measures of each image's ranked captions.

    Args:
        caption_sets: image id -> its captions (raw text, best first; at least one each).
        references: image id -> its raw reference captions, for ``oracle CIDEr-D`` (None: not
            computed, as for a folder of images).
        tokenizer: ``data.tokenizer``.
    Returns:
        ``oracle CIDEr-D`` (None without references), ``distinct-1`` and ``distinct-2`` (over all
        captions), ``distinct-1 per set`` and ``distinct-2 per set`` (averaged over images),
        ``mBLEU-4`` (None when no image has two captions) and ``captions per image`` (their mean).
    Raises:
        EvaluationInputError: an image without captions, or one without references.
    """
    if not caption_sets:
        raise EvaluationInputError("no caption sets to measure")
    tokenize = tokenizer_for(tokenizer)
    tokenized: dict[int, list[list[str]]] = {}
    for image_id, captions in caption_sets.items():
        if not captions:
            raise EvaluationInputError(f"image {image_id!r} has no captions")
        tokenized[image_id] = [tokenize(caption) for caption in captions]

    def mean(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None]
        return float(np.mean(kept)) if kept else None

    oracle = None
    if references is not None:
        missing = [image_id for image_id in tokenized if not references.get(image_id)]
        if missing:
            raise EvaluationInputError(f"image {missing[0]!r} has no references")
        scorer = CiderDScorer({i: [tokenize(ref) for ref in references[i]] for i in tokenized})
        oracle = float(np.mean([scorer.scores([i] * len(sets), sets).max() for i, sets in tokenized.items()]))
    corpus = [caption for sets in tokenized.values() for caption in sets]
    return {
        "oracle CIDEr-D": oracle,
        "distinct-1": distinct_ngrams(corpus, 1),
        "distinct-2": distinct_ngrams(corpus, 2),
        "distinct-1 per set": mean([distinct_ngrams(sets, 1) for sets in tokenized.values()]),
        "distinct-2 per set": mean([distinct_ngrams(sets, 2) for sets in tokenized.values()]),
        "mBLEU-4": mean([mutual_bleu(sets) for sets in tokenized.values()]),
        "captions per image": float(np.mean([len(sets) for sets in tokenized.values()])),
    }


def how_sets_were_drawn(strategy: str) -> str:
    """What an image's set is under ``decode.strategy``: the label stored beside the measures.

    Sampled sets are drawn again while they hold fewer than N distinct captions (up to
    ``SAMPLE_ROUNDS`` rounds), which raises distinct-n and lowers mBLEU-4 against N raw samples."""
    if strategy == "sample":
        return (
            f"distinct samples: N drawn, again up to {SAMPLE_ROUNDS} rounds until N are distinct (papers "
            "that take N raw samples report lower distinct-n and higher mBLEU-4)"
        )
    return "the search's best distinct hypotheses"


def caption_set_lines(measures: Mapping[str, float | str | None]) -> list[str]:
    """The measures as lines for a summary (``n/a`` where not computed; a label as it is)."""
    return [
        f"{name:<20} {'n/a' if value is None else value if isinstance(value, str) else f'{value:.4f}'}"
        for name, value in measures.items()
    ]
