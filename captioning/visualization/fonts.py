"""The fonts figure text is drawn with, and what no installed font draws.

matplotlib's default font lacks Chinese, Japanese and Korean glyphs; ``font_families`` adds the
installed fonts that have them (matplotlib falls back to them glyph by glyph), and ``font_note`` says
once which characters of the captions no font draws, with the fix.
"""

from __future__ import annotations

import contextlib
import logging
import unicodedata
import warnings
from collections.abc import Iterable, Iterator
from functools import lru_cache

from matplotlib import font_manager, rcParams
from matplotlib.font_manager import FontProperties
from matplotlib.ft2font import FT2Font

# Fonts with Chinese, Japanese and Korean glyphs, used (when installed) for the characters the default
# font lacks: captions of data.tokenizer characters or whitespace are drawn, not shown as empty boxes.
CJK_FONTS = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK KR",
    "Source Han Sans SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "AR PL UMing CN",
)


@lru_cache(maxsize=1)
def font_families() -> tuple[str, ...]:
    """The fonts figure text is drawn with: matplotlib's default, then each installed ``CJK_FONTS`` font,
    which matplotlib falls back to glyph by glyph."""
    installed = {font.name for font in font_manager.fontManager.ttflist}
    return (*rcParams["font.sans-serif"][:1], *(name for name in CJK_FONTS if name in installed))


FONT_FIX = (
    "install a font for them (Debian: apt install fonts-noto-cjk), then delete matplotlib's font cache "
    "(rm -r ~/.cache/matplotlib) so that it is found (docs/own-data.md)"
)


@contextlib.contextmanager
def quiet_fonts() -> Iterator[None]:
    """Keep matplotlib's font noise off stderr while drawing: a ``Glyph ... missing`` warning per
    character and a ``findfont: ...`` line per family it cannot find (``font_note`` says it once)."""
    font_log = logging.getLogger("matplotlib.font_manager")
    level = font_log.level
    font_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            yield
    finally:
        font_log.setLevel(level)


@lru_cache(maxsize=1)
def _drawn_characters() -> frozenset[int]:
    """The code points some font of ``font_families()`` has a glyph for."""
    drawn: set[int] = set()
    with quiet_fonts():
        for family in font_families():
            try:
                path = font_manager.findfont(FontProperties(family=family), fallback_to_default=False)
                drawn.update(FT2Font(path).get_charmap())
            except (ValueError, OSError, RuntimeError):  # not found, or a file FreeType cannot read
                continue
    return frozenset(drawn)


def missing_characters(texts: Iterable[str]) -> str:
    """The characters of ``texts`` that no figure font draws (they show as empty boxes), each once."""
    drawn = _drawn_characters()
    missing: dict[str, None] = {}
    for text in texts:
        for character in text:
            if ord(character) not in drawn and unicodedata.category(character)[0] not in "ZC":
                missing.setdefault(character)
    return "".join(missing)


def font_note(texts: Iterable[str]) -> str | None:
    """One warning line when figures would draw some characters of ``texts`` as empty boxes, with the
    fix; None when every character has a font."""
    missing = missing_characters(texts)
    if not missing:
        return None
    shown = missing[:8] + ("..." if len(missing) > 8 else "")
    return (
        f"warning: {len(missing)} characters of these captions ({shown}) are in no installed font, so "
        f"the figures draw them as empty boxes: {FONT_FIX}"
    )
