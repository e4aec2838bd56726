"""The HTML pages' templates: jinja2 templates shipped as package data in ``templates/``, their
styles and scripts in files of their own (``viewer.css``, ``viewer.js``, ``run_report.css``,
``run_report.js``), inlined into each page so that a page stays one self-contained file.

Every value a template prints is escaped (``autoescape``) unless it is HTML this package built
(marked ``| safe`` in the template: the image sections, the styles and scripts).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import jinja2


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("captioning.visualization", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a value a template names but is not given is a bug
        keep_trailing_newline=True,
    )


def page_asset(name: str) -> str:
    """The text of ``templates/<name>`` (a style sheet or a script), without its final newline."""
    return (
        resources.files("captioning.visualization")
        .joinpath("templates")
        .joinpath(name)
        .read_text("utf-8")
        .strip()
    )


def render_page(template: str, **values: Any) -> str:
    """``templates/<template>`` rendered with ``values``."""
    return _environment().get_template(template).render(**values)
