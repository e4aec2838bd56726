"""The project's expected failures: one base class the tools print as one line.

Every error the package raises for a problem with what it was given (a configuration value, a data
file, a checkpoint, an image, an output path, a missing Java or CUDA) is a :class:`CaptioningError`,
and also the built-in kind it always was (``ValueError``, ``OSError``, ``RuntimeError``), so a
caller's ``except ValueError`` keeps working. The command-line tools print such an error, and an
``OSError`` met reading or writing a file, as one line ``error: ...``; anything else, a bare
``ValueError`` or ``RuntimeError`` included, is a bug (here, in torch, or in a module of your own
passed with ``--import``) and keeps Python's traceback.
"""

from __future__ import annotations


class CaptioningError(Exception):
    """An expected failure: its message is the whole story (``error: <message>`` on the command line)."""


class ConfigError(CaptioningError, ValueError):
    """A configuration value or file is invalid; the message names the key (``captioning.config``
    raises it, and its public names include it)."""


class CheckpointError(CaptioningError, ValueError):
    """A checkpoint, model folder or export cannot be written or used; the message is one line naming
    the file (``captioning.hub.checkpoint`` and ``captioning.export`` raise it)."""


class InputError(CaptioningError, ValueError):
    """A value given to a tool or a function is not one it takes (a flag, a device name, an attention
    layer): the message names the option and what it takes."""


class MissingExtraError(CaptioningError, ImportError):
    """An option needs an optional extra that is not installed: the message names the option and the
    extra that installs it (``captioning.utils.extras``)."""


class RunError(CaptioningError, RuntimeError):
    """An expected failure while running: no CUDA or Java where asked for, a process of the group
    that failed or sent nothing."""
