"""What every dataset reader returns: one ``ImageRecord`` per image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
