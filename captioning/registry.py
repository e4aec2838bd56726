"""``Registry``: the one pattern of every extension point (encoders, attention scorers, decoders,
metrics, dataset readers).

A registry maps names to entries (a class, a builder function). A decorator adds an entry under a
name, so the code that defines a part is the only place that names it; configuration checks,
``--help`` choices and error messages read the registry, never a hand-copied list. A module of your
own registers its parts the same way and reaches the tools with ``--import MODULE``
(docs/extending.md)::

    SCORERS = Registry("attention scorer", key="model.decoder.scoring")

    @SCORERS.register("additive")
    class AdditiveAttention(Attention): ...

    SCORERS["additive"]      # the class; an unknown name raises one line listing the registered ones
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from captioning.utils.errors import CaptioningError

T = TypeVar("T")


class UnknownNameError(CaptioningError, ValueError):
    """A name no registry entry has; the message lists the registered names and the key that chose it."""


class Registry(Generic[T]):
    """Names -> entries, filled by ``@registry.register(name)``.

    Args:
        what: what an entry is, for messages ("attention scorer").
        key: the configuration key or option whose value is looked up here ("model.decoder.scoring"),
            named by the error of an unknown name.
    """

    def __init__(self, what: str, key: str | None = None) -> None:
        self.what = what
        self.key = key
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator adding the decorated class or function under ``name``; a name is registered once.

        Raises:
            ValueError: ``name`` is empty, holds whitespace, or is registered already.
        """

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def add(self, name: str, entry: T) -> None:
        """``entry`` under ``name`` (what the decorator does)."""
        if not name or name != name.strip() or any(character.isspace() for character in name):
            raise ValueError(f"{self.what} name must be a non-empty word, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise UnknownNameError(self.unknown_message(name))
        return self._entries[name]

    def unknown_message(self, name: object) -> str:
        """One line: the unknown ``name``, the key that chose it and every registered name."""
        where = f"{self.key} " if self.key else ""
        return (
            f"{where}names an unknown {self.what} {name!r}; registered: {', '.join(self.names())} "
            f"(a module of your own can register one: --import MODULE on the command line; in Python, "
            "import it first or pass captioning.load(..., imports=[MODULE]))"
        )

    def check(self, name: str) -> str:
        """``name`` when it is registered.

        Raises:
            UnknownNameError: naming the key and listing the registered names.
        """
        if name not in self._entries:
            raise UnknownNameError(self.unknown_message(name))
        return name

    def get(self, name: str, default: T | None = None) -> T | None:
        """The entry of ``name``, or ``default`` when it is not registered."""
        return self._entries.get(name, default)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order (the built-in ones first)."""
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"
