"""Caption metrics as the official COCO caption evaluation computes them, with a Java-less fallback.

With Java, :func:`score_captions` does what pycocoevalcap's ``COCOEvalCap.evaluate`` does: the
Stanford PTB tokenizer, then BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (pycocoevalcap's ``Cider`` is the
CIDEr-D variant: clipped n-gram counts and a Gaussian length penalty) and, when asked and its
models are present, SPICE. Without Java, captions go through :func:`captioning.data.tokenizers.tokenize`
(which reproduces the PTB tokenizer on ordinary captions) and the pure-Python scorers; METEOR and
SPICE, which need Java, are reported unavailable with the reason, never as 0.

Captions in other languages are scored with their own tokenizer (``tokenizer="whitespace"`` or
``"characters"``, :data:`captioning.data.tokenizers.TOKENIZERS`): BLEU, ROUGE-L and CIDEr-D on its tokens, the
same tokens training used; METEOR and SPICE, English-only, are reported unavailable.

The metrics themselves are registered in :data:`captioning.evaluation.scorers.METRICS`, each with what
it reports and needs; :func:`score_captions` runs every registered one. The COCO files these scores
come from are read by :mod:`captioning.evaluation.coco_files`.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pycocoevalcap.cider.cider_scorer import CiderScorer

from captioning.data.tokenizers import tokenizer_for
from captioning.evaluation.coco_files import EvaluationInputError
from captioning.evaluation.java import DEFAULT_TIMEOUT_S, JavaTimeout, ptb_tokenize
from captioning.evaluation.scorers import METRICS, NLTK_BLEU, Metric, reported_metrics
from captioning.utils.errors import RunError

# Characters the PTB tokenizer reads as line ends: one inside a caption would shift every later caption.
_LINE_BREAKS = str.maketrans({ch: " " for ch in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


# One caption's tf-idf vectors (one dict per n-gram order), their norms, and its length.
_TfIdf = tuple[list[dict[tuple[str, ...], float]], list[float], int]


@dataclass
class Scores:
    """Scores of one set of candidate captions.

    Attributes:
        overall: corpus scores under the keys the metrics of :data:`METRICS` report, in their
            order (None where unavailable).
        unavailable: metric -> why it was not computed.
        per_image: image id -> metric -> the image's score (BLEU-n per image as pycocoevalcap gives it).
        tokenizer: ``"ptb"`` (Stanford, via Java), ``"python"``
            (:func:`captioning.data.tokenizers.tokenize`), or the other tokenizer the captions were
            scored with (``"whitespace"``, ``"characters"``).
    """

    overall: dict[str, float | None]
    unavailable: dict[str, str] = field(default_factory=dict)
    per_image: dict[int, dict[str, float]] = field(default_factory=dict)
    tokenizer: str = "ptb"

    def to_json(self) -> dict[str, Any]:
        """The scores JSON: metric keys at the top level (null where unavailable) and ``unavailable``."""
        return {
            **self.overall,
            "unavailable": dict(self.unavailable),
            "tokenizer": self.tokenizer,
            "images": len(self.per_image),
        }

    def per_image_json(self) -> list[dict[str, Any]]:
        """Per-image scores as a list of ``{"image_id": id, metric: score, ...}``."""
        return [{"image_id": image_id, **scores} for image_id, scores in self.per_image.items()]

    def table(self) -> str:
        """A console summary: one line per metric, scores as in papers (x100) and raw values."""
        width = max(len(name) for name in self.overall)
        lines = [f"{'metric':<{width}}  {'x100':>7}  {'value':>8}", "-" * (width + 19)]
        for name, value in self.overall.items():
            if value is None:
                lines.append(f"{name:<{width}}  {'n/a':>7}  ({self.unavailable.get(name, 'not computed')})")
            else:
                lines.append(f"{name:<{width}}  {100 * value:7.2f}  {value:8.4f}")
        lines.append(f"{len(self.per_image)} images, {self.tokenizer} tokenizer")
        return "\n".join(lines)


def score_captions(
    references: Mapping[int, Sequence[str]],
    candidates: Mapping[int, str],
    use_java: bool | None = None,
    spice: bool = False,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    tokenizer: str = "ptb",
) -> Scores:
    """Score one candidate caption per image against that image's reference captions.

    Args:
        references: image id -> raw reference captions (at least one each).
        candidates: image id -> raw candidate caption (may be empty: it scores 0). The ids must be
            exactly those of ``references``, as the official evaluation requires.
        use_java: True: PTB tokenizer and METEOR via Java (as the official toolkit); False: the
            pure-Python path; None: Java when ``java`` is on the PATH.
        spice: also compute SPICE (Java, and Stanford CoreNLP models already installed).
        java_timeout: seconds each Java call (PTB tokenizer, METEOR) may take; past it, one line on
            stderr and the Java-less path, as without Java.
        tokenizer: ``"ptb"`` (English) or another name of :data:`captioning.data.tokenizers.TOKENIZERS`, which
            scores on its tokens without Java, METEOR and SPICE reported unavailable (English only).
    Returns:
        :class:`Scores` with BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE and the NLTK corpus BLEU-4.
    Raises:
        EvaluationInputError: no images, ids that do not match, an image without references, a
            caption that is not a string.
        RuntimeError: ``use_java=True`` without a ``java`` executable.
    """
    _validate(references, candidates)
    java = shutil.which("java") is not None
    if use_java is None:
        use_java = java
    elif use_java and not java:
        raise RunError("use_java=True but no 'java' executable is on the PATH")
    image_ids = list(references)
    english = tokenizer == "ptb"
    use_java = use_java and english
    try:
        gts, res = tokenize_captions(references, candidates, use_java, java_timeout, tokenizer)
    except JavaTimeout as error:
        print(f"warning: {error}; scoring without Java (no METEOR)", file=sys.stderr, flush=True)
        use_java = False
        gts, res = tokenize_captions(references, candidates, use_java)

    overall: dict[str, float | None] = dict.fromkeys(reported_metrics())
    unavailable: dict[str, str] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in image_ids}
    for name, metric_class in METRICS.items():
        metric = metric_class()
        reason = _unavailable(metric, tokenizer, use_java, spice)
        if reason is None:
            try:
                computed = metric.compute(gts, res, image_ids, java_timeout)
            except JavaTimeout as error:
                print(f"warning: {error}; {name} is reported unavailable", file=sys.stderr, flush=True)
                reason = str(error)
        if reason is not None:
            unavailable.update(dict.fromkeys(metric.reports, reason))
            continue
        for key, (score, scores) in computed.items():
            overall[key] = float(score)
            if metric.per_image:
                for image_id, value in zip(image_ids, scores, strict=True):
                    per_image[image_id][key] = float(value)
    return Scores(
        overall, unavailable, per_image, tokenizer if not english else "ptb" if use_java else "python"
    )


def _unavailable(metric: Metric, tokenizer: str, use_java: bool, requested: bool) -> str | None:
    """Why ``metric`` is not computed for these captions, or None when it is."""
    if metric.english_only and tokenizer != "ptb":
        return f"English only; these captions were scored with the {tokenizer} tokenizer, not ptb"
    if metric.on_request and not requested:
        return "not requested (evaluate.py --spice computes it; spice=True in Python)"
    if metric.needs_java and not use_java:
        return f"needs Java ({metric.java_part}); no Java runtime was used"
    return metric.unavailable()


def tokenize_captions(
    references: Mapping[int, Sequence[str]],
    candidates: Mapping[int, str],
    use_java: bool,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    tokenizer: str = "ptb",
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Tokenize as the metrics do: ``(image id -> references, image id -> [candidate])``, each caption
    one string of space-separated lower-case tokens (PTB via Java when ``use_java`` and ``tokenizer`` is
    ptb, else the named tokenizer of :data:`captioning.data.tokenizers.TOKENIZERS`).

    Raises:
        JavaTimeout: the PTB tokenizer ran past ``java_timeout`` seconds.
    """
    image_ids = list(references)
    if use_java and tokenizer == "ptb":
        return _ptb_tokenize(references, candidates, image_ids, java_timeout)
    tokenize = tokenizer_for(tokenizer)
    gts = {i: [" ".join(tokenize(ref)) for ref in references[i]] for i in image_ids}
    res = {i: [" ".join(tokenize(candidates[i]))] for i in image_ids}
    return gts, res


def _validate(references: Mapping[int, Sequence[str]], candidates: Mapping[int, str]) -> None:
    if not references:
        raise EvaluationInputError("no images to score: the references are empty")
    for image_id, caption in candidates.items():
        if image_id not in references:
            raise EvaluationInputError(f"candidate for image {image_id!r} has no references")
        if not isinstance(caption, str):
            raise EvaluationInputError(f"candidate for image {image_id!r} is not a string: {caption!r}")
    for image_id, refs in references.items():
        if image_id not in candidates:
            raise EvaluationInputError(f"no candidate for image {image_id!r}, which has references")
        if isinstance(refs, str) or len(refs) == 0:
            raise EvaluationInputError(f"image {image_id!r}: references must be a non-empty list of strings")
        if not all(isinstance(ref, str) for ref in refs):
            raise EvaluationInputError(f"image {image_id!r}: a reference caption is not a string")


def _ptb_tokenize(
    references: Mapping[int, Sequence[str]],
    candidates: Mapping[int, str],
    image_ids: list[int],
    timeout: float,
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Tokenize as COCOEvalCap does: one PTB tokenizer (Java) call for references, one for candidates."""

    def run(captions: dict[int, list[str]]) -> dict[int, list[str]]:
        tokenized = ptb_tokenize(
            {i: [c.translate(_LINE_BREAKS) for c in caps] for i, caps in captions.items()}, timeout
        )
        if any(len(tokenized.get(i, ())) != len(caps) for i, caps in captions.items()):
            raise RuntimeError("the PTB tokenizer returned a different number of captions than it was given")
        return tokenized

    gts = run({i: list(references[i]) for i in image_ids})
    res = run({i: [candidates[i]] for i in image_ids})
    return gts, res


class CiderDScorer:
    """Per-candidate CIDEr-D against a fixed corpus, for self-critical training rewards.

    Document frequencies come once from the training references (through pycocoevalcap's
    ``CiderScorer``); candidates are then scored exactly as pycocoevalcap's ``Cider`` scores them
    (n = 4, sigma = 6, clipped tf-idf cosine, Gaussian length penalty, x10), so over the same
    corpus the values equal ``Cider().compute_score``'s per-image scores.

    Args:
        references_by_image: image id -> tokenized reference captions.
        n: largest n-gram order.
        sigma: width of the length penalty.
    """

    def __init__(
        self, references_by_image: Mapping[int, Sequence[Sequence[str]]], n: int = 4, sigma: float = 6.0
    ):
        if not references_by_image:
            raise EvaluationInputError("CiderDScorer needs at least one image with references")
        corpus = CiderScorer(n=n, sigma=sigma)
        self._references: dict[int, list[str]] = {}
        for image_id, refs in references_by_image.items():
            if len(refs) == 0:
                raise EvaluationInputError(f"image {image_id!r} has no references")
            self._references[image_id] = [" ".join(ref) for ref in refs]
            corpus.cook_append(None, self._references[image_id])
        corpus.compute_doc_freq()
        self.n, self.sigma = n, sigma
        self.ref_len = float(np.log(float(len(corpus.crefs))))  # log of the corpus size, as CiderScorer
        # tf-idf weight of each n-gram seen in the corpus; an unseen one weighs ref_len (df taken as 1)
        self._idf = {
            gram: float(self.ref_len - np.log(max(1.0, df))) for gram, df in corpus.document_frequency.items()
        }

    def scores(self, image_ids: Sequence[int], candidates: Sequence[Sequence[str]]) -> np.ndarray:
        """CIDEr-D of each candidate against its image's references.

        Args:
            image_ids: (N,) the image of each candidate; repeats are fine (several samples per image).
            candidates: (N,) tokenized candidates.
        Returns:
            (N,) float64 scores.
        """
        if len(image_ids) != len(candidates):
            raise ValueError(f"{len(image_ids)} image ids but {len(candidates)} candidates")
        references: dict[int, list[_TfIdf]] = {}
        out = np.empty(len(candidates), dtype=np.float64)
        for index, (image_id, candidate) in enumerate(zip(image_ids, candidates, strict=True)):
            refs = references.get(image_id)
            if refs is None:  # an image's reference vectors, once per call
                if image_id not in self._references:
                    raise KeyError(f"image {image_id!r} is not in the CIDEr-D reference corpus")
                refs = references[image_id] = [
                    self._tf_idf(ref.split()) for ref in self._references[image_id]
                ]
            out[index] = self._score(self._tf_idf(" ".join(candidate).split()), refs)
        return out

    def _tf_idf(self, words: list[str]) -> _TfIdf:
        """tf-idf vector per n-gram order, their norms and the length, as CiderScorer's ``counts2vec``."""
        idf, default = self._idf, self.ref_len
        vectors, norms = [], []
        for order in range(1, self.n + 1):
            counts: dict[tuple[str, ...], int] = {}  # first-occurrence order, as pycocoevalcap's precook
            # strict=False: the shifted copies are meant to differ in length (the last n-gram ends there).
            for gram in zip(*(words[i:] for i in range(order)), strict=False):
                counts[gram] = counts.get(gram, 0) + 1
            vector = {gram: float(count) * idf.get(gram, default) for gram, count in counts.items()}
            vectors.append(vector)
            norms.append(math.sqrt(sum(weight**2 for weight in vector.values())))
        # pycocoevalcap counts bigrams as the length (its `n == 1` is the bigram order): kept for equal scores
        return vectors, norms, max(len(words) - 1, 0) if self.n >= 2 else 0

    def _score(self, hyp: _TfIdf, refs: list[_TfIdf]) -> float:
        vec_hyp, norm_hyp, length_hyp = hyp
        total = [0.0] * self.n
        for vec_ref, norm_ref, length_ref in refs:
            penalty = math.e ** (-(float(length_hyp - length_ref) ** 2) / (2 * self.sigma**2))
            for order in range(self.n):
                grams = vec_ref[order]
                value = 0.0
                for gram, weight in vec_hyp[order].items():
                    ref_weight = grams.get(gram)
                    if ref_weight is not None:  # clipped: min(hypothesis, reference) * reference
                        value += min(weight, ref_weight) * ref_weight
                if norm_hyp[order] != 0 and norm_ref[order] != 0:
                    value /= norm_hyp[order] * norm_ref[order]
                total[order] += value * penalty
        return sum(total) / self.n / len(refs) * 10.0


__all__ = [
    "METRICS",
    "NLTK_BLEU",
    "CiderDScorer",
    "EvaluationInputError",
    "Scores",
    "score_captions",
    "tokenize_captions",
]
