"""Configuration: frozen dataclasses per component (``schema``, the tree's root; one module per
section: ``data``, ``model``, ``decode``, ``train``; what they share: ``fields``), YAML files with
``--set`` overrides read and checked (``loading``), and the generated reference page (``reference``).

The dataclasses and errors of these modules are the package's public names
(``from captioning.config import Config``); ``captioning.config.loading.load_config`` reads a file.
"""

# The sections' public names (each module's ``__all__``) are the package's.
from captioning.config.data import *  # noqa: F403
from captioning.config.decode import *  # noqa: F403
from captioning.config.fields import *  # noqa: F403
from captioning.config.model import *  # noqa: F403
from captioning.config.schema import *  # noqa: F403
from captioning.config.train import *  # noqa: F403
