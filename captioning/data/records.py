"""What every dataset reader returns: one ``ImageRecord`` per image."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from captioning.utils.errors import CaptioningError


class DatasetError(CaptioningError, ValueError):
    """Bad dataset input; the message is one line naming the file and the entry."""


@dataclass(frozen=True)
class ImageRecord:
    """One image and its reference captions.

    Attributes:
        image_id: integer id written to results files (COCO id where the source has one).
        path: the image file (absolute, or relative to the working directory).
        split: ``train``, ``val``, ``test`` (or ``restval`` when not merged) ; ``""`` for a plain folder.
        captions: tokenized reference captions (lower case, no punctuation); the training targets.
        raw: every caption as written in the source, in its order: the references for scoring, as
            the official toolkit reads them from the caption file. It also holds captions that
            tokenize to nothing (``"..."``), which ``captions`` leaves out.
    """

    image_id: int
    path: Path
    split: str
    captions: tuple[tuple[str, ...], ...] = ()
    raw: tuple[str, ...] = ()


def records_of_split(records: list[ImageRecord], split: str) -> list[ImageRecord]:
    """The records of one split, in reading order."""
    return [r for r in records if r.split == split]


def shuffled_captions(records: list[ImageRecord], split: str, seed: int) -> list[ImageRecord]:
    """``records`` with the captions of ``split``'s images permuted across those images (Adebayo et al.
    2018's data randomisation test: a model trained on them learns no relation between an image and its
    words). Image k of the split, in reading order, takes the captions (tokenized and raw) of image
    ``permutation[k]``, a permutation drawn from ``seed`` alone; other splits are left as they are."""
    positions = [index for index, record in enumerate(records) if record.split == split]
    permutation = np.random.default_rng(seed).permutation(len(positions))
    result = list(records)
    for position, source in zip(positions, permutation, strict=True):
        donor = records[positions[source]]
        result[position] = replace(records[position], captions=donor.captions, raw=donor.raw)
    return result
