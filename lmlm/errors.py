"""The one base class of lmlm's errors: input a command cannot use, said in one line.

Every error lmlm raises on purpose derives from :class:`LmlmError` (most also from ``ValueError``,
``RuntimeError`` or ``FileNotFoundError``, so code that catches those still works). The CLI catches this
one type and prints ``error: <message>`` with exit code 2 (``lmlm/cli_errors.py``). Ground floor: this
module imports nothing from lmlm.
"""

from __future__ import annotations

__all__ = ["LmlmError", "MissingExtra", "need", "require"]


class LmlmError(Exception):
    """An error the user can act on; its message names what was asked and why it cannot be done."""


class MissingExtra(LmlmError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def need(module: str, extra: str, what: str):
    """Import ``module``, or raise :class:`MissingExtra` naming ``pip install 'lmlm[extra]'`` for ``what``.

    Examples:
        >>> need("json", "worlds", "synthetic worlds").__name__
        'json'
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name != module and not module.startswith(f"{e.name}."):
            raise  # the module is there, but something it imports is broken: not a missing extra
        raise MissingExtra(f"{what} needs {module.split('.')[0]}: pip install 'lmlm[{extra}]'") from e


def require(extra: str, modules: tuple[str, ...], what: str) -> None:
    """Before a long command starts: raise :class:`MissingExtra` for the first of ``modules`` not installed,
    naming ``pip install 'lmlm[extra]'`` (looked up, not imported)."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent that is missing, or a module set aside (None in sys.modules)
            found = False
        if not found:
            raise MissingExtra(f"{what} needs {module}: pip install 'lmlm[{extra}]'")
