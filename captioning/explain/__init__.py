"""Does the map explain the word? Attribution methods beside attention (``methods``, ``transformer``),
deletion and insertion curves (``faithfulness``), cascading randomisation (``sanity``), grounding and
hallucinated mentions per method (``plausibility``) and the table of a captioned split (``study``)."""

from captioning.explain import transformer as _transformer  # noqa: F401 - registers its methods
from captioning.explain.methods import METHODS, ExplainInputs, ExplainSettings, explain, register_method

__all__ = ["METHODS", "ExplainInputs", "ExplainSettings", "explain", "register_method"]
