"""Show, Attend and Tell image captioning with visual attention in modern PyTorch.

The Python API (``captioning.api``) is imported on first use, so ``import captioning`` stays
light (the command-line tools check their inputs before torch is loaded)::

    model = captioning.load("runs/shapes/checkpoints/best.pt")
    caption = model.caption(["photo.jpg"])[0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from captioning.utils.version import package_version

__version__ = package_version()

_API = ("Caption", "CaptioningModel", "load", "show")

if TYPE_CHECKING:
    from captioning.api import Caption, CaptioningModel, load, show


def __getattr__(name: str) -> Any:
    if name in _API:
        from captioning import api

        return getattr(api, name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = ["Caption", "CaptioningModel", "__version__", "load", "show"]
