"""Lazy exports of a package (PEP 562): a name is imported from its module on first use, so
importing one floor of memfs never loads the floors above it."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(namespace: dict, exports: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` for ``exports`` (name → module); a resolved name is cached
    in ``namespace`` (the package's globals), so the hook runs once per name."""
    package = namespace["__name__"]

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
