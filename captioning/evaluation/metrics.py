"""Caption metrics as the official COCO caption evaluation computes them, with a Java-less fallback.

With Java, :func:`score_captions` does what pycocoevalcap's ``COCOEvalCap.evaluate`` does: the
Stanford PTB tokenizer, then BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (pycocoevalcap's ``Cider`` is the
CIDEr-D variant: clipped n-gram counts and a Gaussian length penalty) and, when asked and its
models are present, SPICE. Without Java, captions go through :func:`captioning.text.tokenize`
(which reproduces the PTB tokenizer on ordinary captions) and the pure-Python scorers; METEOR and
SPICE, which need Java, are reported unavailable with the reason, never as 0.

Captions in other languages are scored with their own tokenizer (``tokenizer="whitespace"`` or
``"characters"``, :data:`captioning.text.TOKENIZERS`): BLEU, ROUGE-L and CIDEr-D on its tokens, the
same tokens training used; METEOR and SPICE, English-only, are reported unavailable.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from nltk.translate.bleu_score import corpus_bleu
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer
from pycocoevalcap.rouge.rouge import Rouge
from pycocotools.coco import COCO

from captioning.evaluation.java import DEFAULT_TIMEOUT_S, JavaTimeout, meteor_score, ptb_tokenize
from captioning.files import not_a_regular_file
from captioning.text import tokenizer_for

METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")
# The corpus BLEU-4 of nltk (as the popular PyTorch tutorial reports it): not comparable to BLEU-4.
NLTK_BLEU = "BLEU-4 (NLTK corpus)"
# Characters the PTB tokenizer reads as line ends: one inside a caption would shift every later caption.
_LINE_BREAKS = str.maketrans({ch: " " for ch in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


# One caption's tf-idf vectors (one dict per n-gram order), their norms, and its length.
_TfIdf = tuple[list[dict[tuple[str, ...], float]], list[float], int]


class EvaluationInputError(ValueError):
    """References, candidates or an annotation/results file are malformed."""


@dataclass
class Scores:
    """Scores of one set of candidate captions.

    Attributes:
        overall: corpus scores under the keys of :data:`METRICS` (None where unavailable), then
            :data:`NLTK_BLEU`.
        unavailable: metric -> why it was not computed.
        per_image: image id -> metric -> the image's score (BLEU-n per image as pycocoevalcap gives it).
        tokenizer: ``"ptb"`` (Stanford, via Java), ``"python"`` (:func:`captioning.text.tokenize`), or
            the other tokenizer the captions were scored with (``"whitespace"``, ``"characters"``).
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

    def write_json(self, path: str | Path, per_image_path: str | Path | None = None) -> None:
        """Write :meth:`to_json` to ``path`` and, if given, :meth:`per_image_json` to ``per_image_path``."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2), encoding="utf-8")
        if per_image_path is not None:
            Path(per_image_path).write_text(json.dumps(self.per_image_json()), encoding="utf-8")

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
        tokenizer: ``"ptb"`` (English) or another name of :data:`captioning.text.TOKENIZERS`, which
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
        raise RuntimeError("use_java=True but no 'java' executable is on the PATH")
    image_ids = list(references)
    english = tokenizer == "ptb"
    use_java = use_java and english
    try:
        gts, res = tokenize_captions(references, candidates, use_java, java_timeout, tokenizer)
    except JavaTimeout as error:
        print(f"warning: {error}; scoring without Java (no METEOR)", file=sys.stderr, flush=True)
        use_java = False
        gts, res = tokenize_captions(references, candidates, use_java)

    overall: dict[str, float | None] = dict.fromkeys(METRICS)
    unavailable: dict[str, str] = {}
    per_image: dict[int, dict[str, float]] = {i: {} for i in image_ids}

    def record(name: str, score: float, scores: Sequence[float]) -> None:
        overall[name] = float(score)
        for image_id, value in zip(image_ids, scores, strict=True):
            per_image[image_id][name] = float(value)

    bleu, bleu_per_image = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        record(f"BLEU-{n + 1}", bleu[n], bleu_per_image[n])
    if use_java:
        try:
            record("METEOR", *meteor_score(gts, res, java_timeout))
        except JavaTimeout as error:
            print(f"warning: {error}; METEOR is reported unavailable", file=sys.stderr, flush=True)
            unavailable["METEOR"] = str(error)
    elif not english:
        unavailable["METEOR"] = _english_only(tokenizer)
    else:
        unavailable["METEOR"] = "needs Java (the METEOR 1.5 jar); no Java runtime was used"
    record("ROUGE-L", *Rouge().compute_score(gts, res))
    record("CIDEr-D", *_cider_d(gts, res))
    spice_missing = _spice_unavailable(spice, use_java) if english else _english_only(tokenizer)
    if spice_missing is None:
        record("SPICE", *_spice(gts, res, image_ids))
    else:
        unavailable["SPICE"] = spice_missing
    overall[NLTK_BLEU] = _nltk_corpus_bleu(gts, res, image_ids)
    return Scores(
        overall, unavailable, per_image, tokenizer if not english else "ptb" if use_java else "python"
    )


def _english_only(tokenizer: str) -> str:
    return f"English only (data.tokenizer ptb); these captions were scored with the {tokenizer} tokenizer"


def tokenize_captions(
    references: Mapping[int, Sequence[str]],
    candidates: Mapping[int, str],
    use_java: bool,
    java_timeout: float = DEFAULT_TIMEOUT_S,
    tokenizer: str = "ptb",
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Tokenize as the metrics do: ``(image id -> references, image id -> [candidate])``, each caption
    one string of space-separated lower-case tokens (PTB via Java when ``use_java`` and ``tokenizer`` is
    ptb, else the named tokenizer of :data:`captioning.text.TOKENIZERS`).

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


def _cider_d(gts: dict[int, list[str]], res: dict[int, list[str]]) -> tuple[float, list[float]]:
    if not any(ref.split() for refs in gts.values() for ref in refs):
        return 0.0, [0.0] * len(
            gts
        )  # pycocoevalcap fails on references without a single word; all would be 0
    return Cider().compute_score(gts, res)


def _spice_models() -> list[Path]:
    import pycocoevalcap.spice.spice as spice_module
    from pycocoevalcap.spice.get_stanford_models import JAR, SPICELIB

    lib = Path(spice_module.__file__).parent / SPICELIB
    return [lib / f"{JAR}.jar", lib / f"{JAR}-models.jar"]


def _spice_unavailable(requested: bool, use_java: bool) -> str | None:
    """Why SPICE cannot be computed, or None if it can (never lets pycocoevalcap start a download)."""
    if not requested:
        return "not requested (evaluate.py --spice computes it; spice=True in Python)"
    if not use_java:
        return "needs Java (the SPICE 1.0 jar); no Java runtime was used"
    missing = [path.name for path in _spice_models() if not path.exists()]
    if missing:
        return f"Stanford CoreNLP models for SPICE are not installed ({', '.join(missing)})"
    return None


def _spice(
    gts: dict[int, list[str]], res: dict[int, list[str]], image_ids: list[int]
) -> tuple[float, list[float]]:
    from pycocoevalcap.spice.spice import Spice

    score, scores = Spice().compute_score(gts, res)
    by_id = dict(zip(sorted(gts), scores, strict=True))  # Spice reports in sorted id order
    return score, [by_id[i]["All"]["f"] for i in image_ids]


def _nltk_corpus_bleu(gts: dict[int, list[str]], res: dict[int, list[str]], image_ids: list[int]) -> float:
    references = [[ref.split() for ref in gts[i]] for i in image_ids]
    hypotheses = [res[i][0].split() for i in image_ids]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nltk warns, then returns 0, when an n-gram order has no match
        return float(corpus_bleu(references, hypotheses))


def read_coco_file(path: str | Path, required: Mapping[str, Sequence[str]]) -> COCO:
    """Read a COCO-format JSON file into a pycocotools ``COCO`` index, with one-line errors.

    Args:
        path: the JSON file.
        required: top-level list key -> keys every entry of that list must have, e.g.
            ``{"annotations": ["image_id", "caption"]}``.
    Raises:
        EvaluationInputError: missing file, not JSON, not an object, a missing list or entry key,
            a repeated image or annotation id.
    """
    data = _read_json(path)
    if not isinstance(data, dict):
        raise EvaluationInputError(f"{path}: expected a COCO JSON object, got {type(data).__name__}")
    for list_key, entry_keys in required.items():
        entries = data.get(list_key)
        if not isinstance(entries, list):
            raise EvaluationInputError(f"{path}: missing the list {list_key!r}")
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise EvaluationInputError(f"{path}: {list_key}[{index}] is not an object")
            for key in entry_keys:
                if key not in entry:
                    raise EvaluationInputError(f"{path}: {list_key}[{index}] has no {key!r}")
    for list_key in ("images", "annotations"):  # a repeated id would silently replace an entry in the index
        first_index: dict[Any, int] = {}
        for index, entry in enumerate(data.get(list_key) or []):
            if isinstance(entry, dict) and "id" in entry:
                entry_id = entry["id"]
                if not isinstance(entry_id, (int, str)) or isinstance(entry_id, bool):
                    raise EvaluationInputError(
                        f"{path}: {list_key}[{index}]: id must be an integer or a "
                        f"string, got {entry_id!r:.60}"
                    )
                if entry_id in first_index:
                    raise EvaluationInputError(
                        f"{path}: {list_key}[{index}]: duplicate id {entry_id!r} "
                        f"(also {list_key}[{first_index[entry_id]}])"
                    )
                first_index[entry_id] = index
    annotations = [a for a in data.get("annotations") or [] if isinstance(a, dict)]
    free_id = 1 + max((a["id"] for a in annotations if isinstance(a.get("id"), int)), default=0)
    for annotation in annotations:
        if "id" not in annotation:  # caption files may omit ids; the COCO index needs unique ones
            annotation["id"], free_id = free_id, free_id + 1
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def load_coco_references(annotation_file: str | Path) -> dict[int, list[str]]:
    """Reference captions from a COCO captions file (``annotations`` with ``image_id`` and ``caption``).

    Returns:
        image id -> its captions, for every image that has at least one.
    """
    coco = read_coco_file(annotation_file, {"annotations": ["image_id", "caption"]})
    for index, annotation in enumerate(coco.dataset["annotations"]):
        image_id = annotation["image_id"]
        if isinstance(image_id, bool) or not isinstance(image_id, int):  # would match no result: dropped
            raise EvaluationInputError(
                f"{annotation_file}: annotations[{index}]: image_id must be an integer, got {image_id!r:.60}"
            )
    references: dict[int, list[str]] = {}
    for image_id, image_annotations in coco.imgToAnns.items():
        captions = [annotation["caption"] for annotation in image_annotations]
        if not all(isinstance(caption, str) for caption in captions):
            raise EvaluationInputError(f"{annotation_file}: image {image_id}: a caption is not a string")
        references[image_id] = captions
    return references


def load_results(results_file: str | Path) -> dict[int, str]:
    """Candidate captions from a COCO results file ``[{"image_id": int, "caption": str}, ...]``.

    Raises:
        EvaluationInputError: one line naming the file and entry: not JSON, not a list, a missing
            key, a non-integer id, a non-string caption, a repeated image id.
    """
    data = _read_json(results_file)
    if not isinstance(data, list):
        raise EvaluationInputError(f"{results_file}: expected a list of results, got {type(data).__name__}")
    results: dict[int, str] = {}
    for index, entry in enumerate(data):
        where = f"{results_file}: entry {index}"
        if not isinstance(entry, dict):
            raise EvaluationInputError(f"{where} is not an object")
        for key in ("image_id", "caption"):
            if key not in entry:
                raise EvaluationInputError(f"{where} has no {key!r}")
        image_id, caption = entry["image_id"], entry["caption"]
        if isinstance(image_id, bool) or not isinstance(image_id, int):
            raise EvaluationInputError(f"{where}: image_id must be an integer, got {image_id!r}")
        if not isinstance(caption, str):
            raise EvaluationInputError(f"{where}: caption must be a string, got {caption!r}")
        if image_id in results:
            raise EvaluationInputError(f"{where}: image_id {image_id} appears twice")
        results[image_id] = caption
    return results


def _read_json(path: str | Path) -> Any:
    kind = not_a_regular_file(path)
    if kind is not None:
        raise EvaluationInputError(f"{path}: {kind}")
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        raise EvaluationInputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EvaluationInputError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:
        raise EvaluationInputError(f"{path}: JSON nested too deeply to read") from None


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
        self.ref_len = np.log(float(len(corpus.crefs)))  # log of the corpus size, as CiderScorer
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
        for index, (image_id, candidate) in enumerate(zip(image_ids, candidates)):
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
            for gram in zip(*(words[i:] for i in range(order))):
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
    "load_coco_references",
    "load_results",
    "read_coco_file",
    "score_captions",
    "tokenize_captions",
]
