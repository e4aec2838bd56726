"""The package's version, declared once (``setup.cfg``): the installed package's metadata, else, in a
source checkout that was never installed, ``setup.cfg`` beside the package."""

from __future__ import annotations

import configparser
import functools
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"


@functools.cache
def package_version() -> str:
    """``"0.1.0"``: the version the package was installed with, or its checkout's ``setup.cfg`` says
    (``"0+unknown"`` when neither is there)."""
    try:
        return version("captioning")
    except PackageNotFoundError:
        return source_version(SETUP_CFG)


def source_version(setup_cfg: Path) -> str:
    """``[metadata] version`` of a ``setup.cfg``; ``"0+unknown"`` when the file or the key is missing."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(setup_cfg, encoding="utf-8")
    except (OSError, configparser.Error):
        return "0+unknown"
    return parser.get("metadata", "version", fallback="0+unknown")
