"""The version is declared once, in setup.cfg: the installed metadata's, else the checkout's file."""

from __future__ import annotations

import configparser
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import captioning
from captioning.utils import version as version_module
from captioning.utils.version import SETUP_CFG, package_version, source_version

REPOSITORY = Path(__file__).resolve().parents[2]


def declared() -> str:
    parser = configparser.ConfigParser()
    parser.read(REPOSITORY / "setup.cfg", encoding="utf-8")
    return parser["metadata"]["version"]


def test_the_version_is_setup_cfgs():
    assert SETUP_CFG == REPOSITORY / "setup.cfg"
    assert captioning.__version__ == package_version() == declared()


def test_a_checkout_never_installed_reads_setup_cfg(tmp_path, monkeypatch):
    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(version_module, "version", not_installed)
    package_version.cache_clear()
    try:
        assert package_version() == declared()
    finally:
        package_version.cache_clear()
    written = tmp_path / "setup.cfg"
    written.write_text("[metadata]\nname = captioning\nversion = 9.8.7\n", encoding="utf-8")
    assert source_version(written) == "9.8.7"
    assert source_version(tmp_path / "missing.cfg") == "0+unknown"
