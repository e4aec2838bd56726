"""Captions that say nothing about their image: all (or mostly) empty, or all (or mostly) the same.

A run that ends this way still writes scores (low ones), checkpoints and figures, and nothing else
says why; ``degenerate_captions`` gives the one warning line the epoch line and the closing summary
carry, with what usually causes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

MOSTLY = 0.8  # the share of captions from which "empty" or "the same" is worth a warning

_EMPTY_CAUSE = (
    "the decoder ends each caption at once: usually too few training steps, or too high a "
    "learning rate; train longer (more epochs or images) or lower train.lr"
)
_SAME_CAUSE = (
    "the decoder ignores the image and writes the commonest caption: usually too few training "
    "steps, too high a learning rate, or features that do not depend on the image "
    "(model.encoder.weights=none)"
)


def degenerate_captions(captions: Sequence[str], split: str) -> str | None:
    """One warning line when at least ``MOSTLY`` of ``captions`` are empty or the same caption, else None.

    Args:
        captions: one generated caption per image, words joined by spaces ("" for an empty one).
        split: what the captions are of, for the message ("validation", "test").
    """
    total = len(captions)
    if total == 0:
        return None
    empty = sum(1 for caption in captions if not caption.strip())
    if empty >= MOSTLY * total:
        return f"warning: {empty} of {total} {split} captions are empty; {_EMPTY_CAUSE}"
    commonest, count = Counter(caption for caption in captions if caption.strip()).most_common(1)[0]
    if total >= 2 and count >= MOSTLY * total:
        return f"warning: {count} of {total} {split} captions are the same, {commonest!r}; {_SAME_CAUSE}"
    return None
