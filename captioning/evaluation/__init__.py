"""Evaluation: caption metrics (the official COCO toolkit and its Java-less path) and attention grounding."""

from captioning.evaluation.coco_files import EvaluationInputError, load_coco_references, load_results
from captioning.evaluation.coco_words import COCO_WORDS, CategoryWords, mentioned_categories
from captioning.evaluation.grounding import (
    Instances,
    ObjectBox,
    WordMatcher,
    grounding_scores,
    load_instances,
)
from captioning.evaluation.metrics import CiderDScorer, Scores, score_captions
from captioning.evaluation.scorers import METRICS, NLTK_BLEU, Metric, validation_metrics

__all__ = [
    "COCO_WORDS",
    "METRICS",
    "NLTK_BLEU",
    "CategoryWords",
    "CiderDScorer",
    "EvaluationInputError",
    "Instances",
    "Metric",
    "ObjectBox",
    "Scores",
    "WordMatcher",
    "grounding_scores",
    "load_coco_references",
    "load_instances",
    "load_results",
    "mentioned_categories",
    "score_captions",
    "validation_metrics",
]
