"""Captions that say nothing about their image: mostly empty, one word, the same caption, or the same
few captions.

A run that ends this way still writes scores (low ones), checkpoints and figures, and nothing else
says why; ``degenerate_captions`` gives the one warning line the epoch line and the closing summary
carry, with what usually causes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from captioning.data.tokenizers import tokenizer_for

MOSTLY = 0.8  # the share of captions from which "empty" or "the same" is worth a warning
FEW = 3  # "the same few captions": at most this many distinct ones (with empty ones) cover MOSTLY

_EMPTY_CAUSE = (
    "the decoder ends each caption at once: usually too few training steps, or too high a "
    "learning rate; train longer (more epochs or images) or lower train.lr"
)
_SAME_CAUSE = (
    "the decoder ignores the image and writes the commonest caption: usually too few training "
    "steps, too high a learning rate, or features that do not depend on the image "
    "(model.encoder.weights=none)"
)


def degenerate_captions(captions: Sequence[str], split: str, tokenizer: str = "ptb") -> str | None:
    """One warning line when at least ``MOSTLY`` of ``captions`` are empty or the same caption, else None.

    Args:
        captions: one generated caption per image, as written in the results ("" for an empty one;
            Chinese and Japanese words joined without spaces).
        split: what the captions are of, for the message ("validation", "test").
        tokenizer: the run's ``data.tokenizer``, which counts a caption's words: "一个大的黄色正方形"
            is one string but five jieba words.
    """
    total = len(captions)
    if total == 0:
        return None
    empty = sum(1 for caption in captions if not caption.strip())
    if empty >= MOSTLY * total:
        return f"warning: {empty} of {total} {split} captions are empty; {_EMPTY_CAUSE}"
    counts = Counter(caption for caption in captions if caption.strip())
    commonest, count = counts.most_common(1)[0]
    if total >= 2 and count >= MOSTLY * total:
        return f"warning: {count} of {total} {split} captions are the same, {commonest!r}; {_SAME_CAUSE}"
    words = tokenizer_for(tokenizer)
    short = sum(1 for caption in captions if len(words(caption)) <= 1)
    if total >= 2 and short >= MOSTLY * total:  # 13 empty and 12 "a" say as little as 25 empty
        return (
            f"warning: {short} of {total} {split} captions are empty or one word "
            f"({empty} empty); {_EMPTY_CAUSE}"
        )
    few = [text for text, _ in counts.most_common(FEW)]
    covered = empty + sum(counts[text] for text in few)
    if total >= 5 * FEW and covered >= MOSTLY * total:  # enough images for few strings to mean something
        shown = ", ".join(repr(text) for text in few)
        return (
            f"warning: {covered} of {total} {split} captions are empty or one of {len(few)} captions "
            f"({shown}); {_SAME_CAUSE}"
        )
    return None
