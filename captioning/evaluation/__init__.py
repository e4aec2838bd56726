"""Evaluation: caption metrics (the official COCO toolkit and its Java-less path) and attention grounding."""

from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords, mentioned_categories
from captioning.evaluation.grounding import (
    Instances,
    ObjectBox,
    WordMatcher,
    grounding_scores,
    load_instances,
)
from captioning.evaluation.metrics import (
    METRICS,
    NLTK_BLEU,
    CiderDScorer,
    EvaluationInputError,
    Scores,
    load_coco_references,
    load_results,
    score_captions,
)

__all__ = [
    "COCO_WORDS",
    "METRICS",
    "NLTK_BLEU",
    "CategoryWords",
    "CiderDScorer",
    "EvaluationInputError",
    "Instances",
    "ObjectBox",
    "Scores",
    "WordMatcher",
    "grounding_scores",
    "load_coco_references",
    "load_instances",
    "load_results",
    "mentioned_categories",
    "score_captions",
]
