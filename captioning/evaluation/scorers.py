"""``METRICS``: the caption metrics, each registered beside its code with what it reports and needs.

A metric is a :class:`Metric` class registered with ``@METRICS.register(name)``; it says which score
keys it reports, whether it needs Java or English captions, and the range of its scores, and its
``compute`` scores tokenized captions. :func:`captioning.evaluation.metrics.score_captions` runs
every registered metric (the order of registration is the order of the scores files), and the
metrics ``train.metric`` may name are those that need no Java (:func:`validation_metrics`), since
validation runs without it. A module of your own registers one the same way and reaches the tools
with ``--import MODULE`` (docs/extending.md, "A new metric"); every registered name is held to the
properties its docstring states by tests/evaluation/test_metric_contract.py.

The built-in ones are pycocoevalcap's, as the official COCO caption evaluation computes them
(``Cider`` there is CIDEr-D: clipped n-gram counts and a Gaussian length penalty), and the NLTK
corpus BLEU-4 the popular PyTorch tutorial reports.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from nltk.translate.bleu_score import corpus_bleu
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from captioning.evaluation.java import meteor_score
from captioning.registry import Registry, UnknownNameError

# Tokenized captions as pycocoevalcap takes them: image id -> captions, each one string of
# space-separated tokens (``res`` holds one caption per image).
Captions = dict[int, list[str]]
# Score key -> (corpus score, per-image scores in the order of the image ids given).
Computed = dict[str, tuple[float, list[float]]]


class Metric:
    """A caption metric; subclasses are registered in ``METRICS`` under their name.

    Attributes:
        reports: the score keys it writes (``BLEU`` reports ``BLEU-1`` .. ``BLEU-4``).
        needs_java: computed only when Java is used; otherwise reported unavailable, never as 0.
        java_part: what of it runs on Java (for that message).
        english_only: computed only on English captions (``data.tokenizer`` ptb).
        on_request: computed only when asked (``score_captions(spice=True)``, evaluate.py ``--spice``).
        per_image: whether it gives each image a score (a corpus statistic does not).
        validates: ``train.metric`` may name its keys when it needs no Java.
        lowest: the score of a caption that shares no word with its references, and the least any
            caption scores.
        highest: the most any caption scores; a caption identical to all its references scores at
            least as well as any other caption.
    """

    reports: ClassVar[tuple[str, ...]] = ()
    needs_java: ClassVar[bool] = False
    java_part: ClassVar[str] = ""
    english_only: ClassVar[bool] = False
    on_request: ClassVar[bool] = False
    per_image: ClassVar[bool] = True
    validates: ClassVar[bool] = True
    lowest: ClassVar[float] = 0.0
    highest: ClassVar[float] = 1.0

    def unavailable(self) -> str | None:
        """Why it cannot be computed here although Java is used (a missing model file), or None."""
        return None

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        """Score tokenized captions.

        Args:
            gts: image id -> its tokenized references.
            res: image id -> [its tokenized candidate].
            image_ids: (N,) the order of the per-image scores.
            java_timeout: seconds a Java call may take.
        Returns:
            key of ``reports`` -> (corpus score, (N,) per-image scores; empty without ``per_image``).
        Raises:
            JavaTimeout: a Java call ran past ``java_timeout``.
        """
        raise NotImplementedError


METRICS: Registry[type[Metric]] = Registry("metric")


@METRICS.register("BLEU")
class BleuMetric(Metric):
    """BLEU-1..4 (Papineni et al. 2002) as pycocoevalcap computes it: clipped n-gram precisions up to
    n, their geometric mean and a brevity penalty against the closest reference length.

    In [0, 1]: 1 for a caption of four or more words identical to all its references; 0 (up to
    pycocoevalcap's 1e-9 smoothing of an empty precision) for one sharing no word with them. The corpus
    score pools the counts of all images, so it is not the mean of the per-image scores.
    """

    reports = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        corpus, per_image = Bleu(4).compute_score(
            _in_order(gts, image_ids), _in_order(res, image_ids), verbose=0
        )
        return {key: (corpus[n], per_image[n]) for n, key in enumerate(self.reports)}


@METRICS.register("METEOR")
class MeteorMetric(Metric):
    """METEOR 1.5 (Denkowski and Lavie 2014; the official toolkit's jar, English): harmonic mean of
    unigram precision and recall over exact, stem, synonym and paraphrase matches, with a
    fragmentation penalty.

    In [0, 1]: 0 for a caption sharing no word (nor stem, synonym or paraphrase) with its references;
    a caption identical to all its references scores the most. The corpus score is METEOR's own
    aggregate over all segments, not the mean of the per-image scores.
    """

    reports = ("METEOR",)
    needs_java = True
    java_part = "the METEOR 1.5 jar"
    english_only = True

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        return {"METEOR": meteor_score(_in_order(gts, image_ids), _in_order(res, image_ids), java_timeout)}


@METRICS.register("ROUGE-L")
class RougeLMetric(Metric):
    """ROUGE-L (Lin 2004) as pycocoevalcap computes it: the F-measure (beta 1.2) of the longest common
    subsequence's precision and recall, the best over the references.

    In [0, 1]: 1 for a caption identical to its references, 0 for one sharing no word with them; the
    corpus score is the mean of the per-image scores.
    """

    reports = ("ROUGE-L",)

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        return {"ROUGE-L": Rouge().compute_score(_in_order(gts, image_ids), _in_order(res, image_ids))}


@METRICS.register("CIDEr-D")
class CiderDMetric(Metric):
    """CIDEr-D (Vedantam et al. 2015) as pycocoevalcap's ``Cider`` computes it: the mean over n = 1..4 of
    the cosine of clipped tf-idf n-gram vectors (document frequencies from the references of all
    scored images), times a Gaussian penalty on the length difference (sigma 6), times 10.

    In [0, 10]: 0 for a caption sharing no word with its references; a caption identical to all its
    references scores the most (10 when its every n-gram is rarer than in every image's references);
    the corpus score is the mean of the per-image scores.
    """

    reports = ("CIDEr-D",)
    highest = 10.0

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        if not any(ref.split() for refs in gts.values() for ref in refs):
            # pycocoevalcap fails on references without a single word; every score would be 0
            return {"CIDEr-D": (0.0, [0.0] * len(image_ids))}
        return {"CIDEr-D": Cider().compute_score(_in_order(gts, image_ids), _in_order(res, image_ids))}


@METRICS.register("SPICE")
class SpiceMetric(Metric):
    """SPICE 1.0 (Anderson et al. 2016; Java, English, Stanford CoreNLP models installed beforehand,
    never downloaded here): the F-score of the semantic-proposition tuples (objects, attributes,
    relations) of the caption's scene graph against the references'.

    In [0, 1]: 0 for a caption sharing no word with its references; an identical caption scores the
    most; computed only on request (it is slow).
    """

    reports = ("SPICE",)
    needs_java = True
    java_part = "the SPICE 1.0 jar"
    english_only = True
    on_request = True

    def unavailable(self) -> str | None:
        missing = [path.name for path in spice_models() if not path.exists()]
        if missing:
            return f"Stanford CoreNLP models for SPICE are not installed ({', '.join(missing)})"
        return None

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        from pycocoevalcap.spice.spice import Spice

        score, scores = Spice().compute_score(gts, res)
        by_id = dict(zip(sorted(gts), scores, strict=True))  # Spice reports in sorted id order
        return {"SPICE": (score, [by_id[i]["All"]["f"] for i in image_ids])}


# The corpus BLEU-4 of nltk (as the popular PyTorch tutorial reports it): not comparable to BLEU-4.
NLTK_BLEU = "BLEU-4 (NLTK corpus)"


@METRICS.register("NLTK-BLEU")
class NltkBleuMetric(Metric):
    """NLTK's corpus BLEU-4, as the popular PyTorch tutorial reports it: pooled n-gram counts of all
    images with NLTK's brevity penalty and no smoothing; kept beside BLEU-4 to compare with numbers
    reported that way, never comparable to it (nor a validation metric).

    In [0, 1]: 1 when every caption of four or more words is identical to all its references, 0 when
    no caption shares a word with its references. A corpus statistic: no per-image scores.
    """

    reports = (NLTK_BLEU,)
    per_image = False
    validates = False

    def compute(
        self, gts: Captions, res: Captions, image_ids: Sequence[int], java_timeout: float
    ) -> Computed:
        references = [[ref.split() for ref in gts[i]] for i in image_ids]
        hypotheses = [res[i][0].split() for i in image_ids]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nltk warns, then returns 0, when an n-gram order has no match
            return {NLTK_BLEU: (float(corpus_bleu(references, hypotheses)), [])}


def _in_order(captions: Captions, image_ids: Sequence[int]) -> Captions:
    """``captions`` keyed in the order of ``image_ids`` (pycocoevalcap lists per-image scores by key)."""
    return {image_id: captions[image_id] for image_id in image_ids}


def spice_models() -> list[Path]:
    """The two jar files of Stanford CoreNLP that SPICE needs beside pycocoevalcap's SPICE jar."""
    import pycocoevalcap.spice.spice as spice_module
    from pycocoevalcap.spice.get_stanford_models import JAR, SPICELIB

    lib = Path(spice_module.__file__).parent / SPICELIB
    return [lib / f"{JAR}.jar", lib / f"{JAR}-models.jar"]


def reported_metrics() -> tuple[str, ...]:
    """Every score key the registered metrics report, in registration order (the scores files' order)."""
    return tuple(key for _, metric in METRICS.items() for key in metric.reports)


def describe_metrics() -> str:
    """One line naming every registered metric's keys and what it needs, for ``--help``: ``"BLEU-1,
    BLEU-2, BLEU-3, BLEU-4, METEOR (Java), ..."``."""
    parts = []
    for name in METRICS.names():
        metric = METRICS[name]
        needs = [
            what
            for what, needed in (("Java", metric.needs_java), ("on request", metric.on_request))
            if needed
        ]
        parts.append(", ".join(metric.reports) + (f" ({', '.join(needs)})" if needs else ""))
    return ", ".join(parts)


def validation_metrics() -> tuple[str, ...]:
    """The score keys validation computes, which ``train.metric`` may name: those of the metrics that
    need no Java and validate."""
    return tuple(
        key
        for _, metric in METRICS.items()
        if metric.validates and not metric.needs_java and not metric.on_request
        for key in metric.reports
    )


def check_validation_metric(name: str) -> str:
    """``name`` when validation computes it.

    Raises:
        UnknownNameError: one line naming ``train.metric`` and listing :func:`validation_metrics`.
    """
    if name not in validation_metrics():
        raise UnknownNameError(
            f"train.metric names {name!r}, which validation does not compute; it computes "
            f"{', '.join(validation_metrics())} (the registered metrics that need no Java; a module "
            "of your own can register one: --import MODULE)"
        )
    return name
