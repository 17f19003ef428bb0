"""How a bad config is reported: one :class:`~kda_contracts.ConfigError` listing each problem by
field path, whatever raised it (pydantic's ``ValidationError``, a validator's ``ValueError``, a
config file that cannot be read), with the original exception as its ``__cause__``.

Example::

    >>> from pydantic import BaseModel
    >>> class C(BaseModel):
    ...     n: int
    >>> with config_errors("C"):
    ...     C(n=[1])
    Traceback (most recent call last):
    ...
    kda_contracts._engine.errors.ConfigError: invalid C: n: Input should be a valid integer (got [1], a list)
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from ..._engine import ConfigError

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxtuple, _REPR.maxlist = 40, 40, 8, 8


def _path(loc: tuple[Any, ...]) -> str:
    """``("kda_layers", 1)`` as ``kda_layers[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def problems_of(exc: ValidationError) -> list[tuple[str, str]]:
    """Each error of a pydantic ``ValidationError`` as ``(field path, readable message)``; the path
    is ``""`` for a check over several fields."""
    found: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        path, kind, msg = _path(tuple(err.get("loc", ()))), err.get("type", ""), str(err.get("msg", ""))
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ConfigError):  # (pydantic runs KDAConfig.__init__ inside its own validation)
            found += [p for p in inner.problems if p not in found]
            continue
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind == "frozen_instance":
            msg = (f"a config is frozen; make a changed copy with cfg.model_copy(update={{{path!r}: ...}})"
                   if path else "a config is frozen")
        elif path and kind != "missing" and "input" in err and not isinstance(err["input"], Mapping):
            value = err["input"]
            kind_of = "" if isinstance(value, (int, float, str)) else f", a {type(value).__name__}"
            msg += f" (got {_REPR.repr(value)}{kind_of})"
        if (path, msg) not in found:
            found.append((path, msg))
    return found


def config_error(owner: str, problems: list[tuple[str, str]]) -> ConfigError:
    """A ConfigError for ``owner`` (``"KDAConfig"``) listing ``problems`` (``(path, message)``)."""
    lines = [f"{path}: {msg}" if path else msg for path, msg in problems] or ["(no detail)"]
    if len(lines) == 1:
        return ConfigError(f"invalid {owner}: {lines[0]}", problems)
    return ConfigError(f"invalid {owner}: {len(lines)} problems\n" + "\n".join(f"  - {line}" for line in lines),
                       problems)


@contextmanager
def config_errors(owner: str) -> Iterator[None]:
    """Raise what goes wrong inside as a ConfigError: a pydantic ``ValidationError`` listing each of
    its errors, a ``ValueError``/``TypeError``/``KeyError``/``OSError`` by its message (a ConfigError
    goes through as it is)."""
    try:
        yield
    except ConfigError:
        raise
    except ValidationError as exc:
        raise config_error(owner, problems_of(exc)) from exc
    except (ValueError, TypeError, KeyError, OSError, AttributeError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise config_error(owner, [("", str(text))]) from exc
