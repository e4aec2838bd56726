"""``settings(**options)``: a ``DecodeConfig`` for calling a search function directly in tests.

``forbid_unk`` is off unless asked for: the tiny random decoders' ``<unk>`` is a word like any other,
and the references the searches are pinned to (exhaustive search, the tutorial's beam search) allow it.
"""

from __future__ import annotations

from captioning.config import DecodeConfig


def settings(**options) -> DecodeConfig:
    """``DecodeConfig(forbid_unk=False, **options)`` (``forbid_unk`` may be given)."""
    return DecodeConfig(**{"forbid_unk": False, **options})
