"""Configuration: frozen dataclasses per component (``schema``), YAML files with ``--set`` overrides
read and checked (``loading``), and the generated reference page (``reference``).

The dataclasses and errors of ``schema`` are the package's public names
(``from captioning.config import Config``); ``captioning.config.loading.load_config`` reads a file.
"""

from captioning.config.schema import *  # noqa: F403  (schema's public names are the package's)
