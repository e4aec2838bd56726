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

An entry that should live only for a block (a test, a notebook cell trying a variant) is registered
in a scope: ``with SCORERS.registered("halved", HalvedAttention): ...``, or ``with SCORERS.scope():``
around decorators and imports; when the block ends the registry holds what it held before.

A ``FamilyRegistry`` is the registry of a concept whose every name brings options of its own (decoder
families, dataset readers): an entry is a ``Family``, the options class and the class built from
them, registered together by one decorator (``register_decoder``, ``register_reader``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from captioning.utils.errors import CaptioningError

T = TypeVar("T")

_ALL: list[Registry[Any]] = []  # every registry made, in order (``registries``)


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
        _ALL.append(self)

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

    @contextlib.contextmanager
    def scope(self) -> Iterator[Registry[T]]:
        """A block whose registrations are undone when it ends, however it ends: the registry then
        holds exactly the entries it held when the block began, a family's class as it was then.

        One thing stays: a class attached in the block to a family that had only its options
        (:meth:`FamilyRegistry.register_options`) is the built-in family's own, attached by the first
        import of the package that defines it; that import is not made again, so undoing it would
        leave the family without its class for the rest of the process.
        """
        saved = dict(self._entries)
        attached = {name: entry.implementation for name, entry in saved.items() if isinstance(entry, Family)}
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)
            for name, implementation in attached.items():
                if implementation is not None:
                    saved[name].implementation = implementation  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def registered(self, name: str, entry: Any, *args: Any) -> Iterator[Any]:
        """``entry`` registered under ``name`` for the block (with ``register``'s further arguments:
        a family's options class), removed when it ends; yields the entry."""
        with self.scope():
            self.register(name, *args)(entry)
            yield entry

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


def registries() -> tuple[Registry[Any], ...]:
    """Every registry made so far (each extension point's, and any a module of your own made)."""
    return tuple(_ALL)


C = TypeVar("C")
Implementation = TypeVar("Implementation", bound=type)


@dataclass(eq=False)
class Family(Generic[C]):
    """One registered family of parts that a configuration key chooses (``model.decoder.kind``,
    ``data.dataset``): ``config``, the frozen dataclass that holds its options, and ``implementation``,
    the class built from them (a ``CaptionDecoder`` subclass, a ``DatasetReader``).

    The configuration layer sits beneath the code of the parts, so a built-in family's options class is
    registered where configurations are read and its class is attached when its package is imported;
    a family of your own registers both at once.
    """

    config: type[C]
    implementation: Any = None  # attached by the package that defines it


class FamilyRegistry(Registry[Family[C]]):
    """Names -> ``Family`` entries: the key's value chooses the family, and with it the class a section
    of the configuration is read into.

    Args:
        what, key: as for :class:`Registry`; ``key`` is the section (``model.decoder``) and its
            field that names the family (``kind``), whose default in a family's options class is the
            family's name.
        base: the section's class (``DecoderConfig``); a family's options class derives from it.
        shared: the section's class itself configures the families without options of their own,
            and any name no family registered (a dataset reader that adds no options).
    """

    def __init__(self, what: str, key: str, base: type[C], shared: bool = False) -> None:
        super().__init__(what, key)
        self.base = base
        self.shared = shared
        self.section, _, self.field = key.rpartition(".")

    def add(self, name: str, entry: Family[C]) -> None:
        if not isinstance(entry, Family):
            raise TypeError(
                f"{self.what} {name!r}: a family registers its class and its options class together "
                f"(docs/extending.md), not a bare {type(entry).__name__}"
            )
        super().add(name, entry)

    def register(self, name: str, config: type[C] | None = None) -> Callable[[Any], Any]:
        """``@DATASETS.register("name")`` as before families: :meth:`register_family` (a reader or
        decoder class, read from ``config``, by default the section's own class)."""
        return self.register_family(name, config)

    def register_options(self, name: str) -> Callable[[type[C]], type[C]]:
        """Decorator registering the options class of the family ``name``, whose class the package
        that defines it attaches with :meth:`register_family` (the built-in families)."""

        def add(config: type[C]) -> type[C]:
            self._check_options(name, config)
            self.add(name, Family(config))
            return config

        return add

    def register_family(
        self, name: str, config: type[C] | None = None
    ) -> Callable[[Implementation], Implementation]:
        """Decorator registering the decorated class as the family ``name``, read from ``config``
        (default: the section's own class, where it is ``shared``): one registration gives the family
        its class and its options. A family whose options class is registered already gets its
        class attached.

        Raises:
            ValueError: ``name`` has a class already, is configured by another class, or ``config``
                is not a dataclass deriving from ``base`` whose name field defaults to ``name``.
        """
        options = self.base if config is None else config

        def add(implementation: Implementation) -> Implementation:
            family = self.get(name)
            if family is None:
                self._check_options(name, options)
                self.add(name, Family(options, implementation))
            elif family.implementation is not None:
                raise ValueError(f"{self.what} {name!r} is already registered")
            elif family.config is not options:
                raise ValueError(f"{self.what} {name!r} is configured by {family.config.__name__} already")
            else:
                family.implementation = implementation
            return implementation

        return add

    def _check_options(self, name: str, config: type) -> None:
        if config is self.base and self.shared:
            return
        if (
            # decorated itself: a plain subclass inherits the base's fields and would lose its own
            "__dataclass_params__" not in vars(config)
            or not issubclass(config, self.base)
            or getattr(config, self.field, None) != name
        ):
            raise ValueError(
                f"{self.what} {name!r}: its configuration must be a dataclass deriving from "
                f"{self.base.__name__} with {self.field} {name!r}"
            )

    def config_class(self, name: str) -> type[C] | None:
        """The options class of ``name``: its family's, the section's own for a name no family
        registered where it is ``shared``, else None."""
        family = self.get(name)
        if family is not None:
            return family.config
        return self.base if self.shared else None

    def owners(self, option: str, besides: type | None = None) -> tuple[str, ...]:
        """The names of the registered families (configured by a class other than ``besides``) whose
        own options (not the section's shared ones) include ``option``, in registration order: more
        than one where their options classes share a base holding it (``data.split_file``: the
        karpathy and coco readers')."""
        shared = {item.name for item in dataclasses.fields(self.base)}  # type: ignore[arg-type]
        return tuple(
            name
            for name, family in self.items()
            if family.config is not besides
            and option in {item.name for item in dataclasses.fields(family.config)} - shared  # type: ignore[arg-type]
        )

    def owners_named(self, names: tuple[str, ...]) -> str:
        """``names`` (from :meth:`owners`) for a message: ``the shapes dataset reader``, ``the karpathy
        and coco dataset readers``."""
        if len(names) == 1:
            return f"the {names[0]} {self.what}"
        return f"the {', '.join(names[:-1])} and {names[-1]} {self.what}s"

    def implementation_of(self, name: str) -> Any:
        """The class of the family ``name``.

        Raises:
            UnknownNameError: no family ``name``, or its class is not registered (its package, or
                the module of your own that registers it, is not imported).
        """
        family = self.get(name)
        if family is None or family.implementation is None:
            raise UnknownNameError(self.unknown_message(name))
        return family.implementation

    def check(self, name: str) -> str:
        """``name`` when a family with a class is registered under it (see :meth:`Registry.check`)."""
        self.implementation_of(name)
        return name
