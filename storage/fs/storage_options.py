"""fsspec storage options from Spark options and CLI flags, and redaction so secrets never reach logs.

Spark lowercases option keys, so keys keep to fsspec's snake_case names (`fs.endpoint_url`); anything
that needs case or nesting is given as JSON (`fs.client_kwargs` = '{"region_name": "us-east-1"}') or as
dotted keys (`fs.client_kwargs.region_name`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import InvalidConfigError

SPARK_PREFIX = "fs."
REDACTED = "***"

# A key is secret when it contains one of these, or one of its words (split at . _ - and camelCase) is one.
_SECRET_PARTS = ("secret", "token", "password", "passwd", "credential", "connection_string", "private_key")
_SECRET_WORDS = frozenset({"key", "pwd", "sas", "auth", "authorization", "session", "accountkey"})
_URL_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")


def is_secret_key(key: str) -> bool:
    """Whether an option of this name may hold a credential (then its value is never shown)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key)).lower()
    return any(p in text for p in _SECRET_PARTS) or any(w in _SECRET_WORDS for w in re.split(r"[._\-\s]+", text))


def _decode(key: str, value: Any) -> Any:
    """JSON-decode a string value (objects, lists, numbers, booleans, null); secrets stay strings."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return value
    if is_secret_key(key) and text[0] not in "{[":
        return value  # a numeric-looking secret must not turn into an int
    try:
        return json.loads(text)
    except ValueError:
        return value


def _put(out: dict, dotted: str, value: Any, source: str) -> None:
    parts = [p for p in dotted.split(".")]
    if not all(parts):
        raise InvalidConfigError(f"{source}: storage option name {dotted!r} has an empty part")
    node = out
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise InvalidConfigError(f"{source}: storage option {dotted!r} nests under {p!r}, which has a value")
        node = child
    last = parts[-1]
    if isinstance(node.get(last), dict) and isinstance(value, dict):
        _merge(node[last], value, f"{source}: storage option {dotted!r}")
    elif last in node:
        raise InvalidConfigError(f"{source}: storage option {dotted!r} is given twice")
    else:
        node[last] = value


def _merge(into: dict, new: dict, where: str) -> None:
    for k, v in new.items():
        if isinstance(into.get(k), dict) and isinstance(v, dict):
            _merge(into[k], v, where)
        elif k in into:
            raise InvalidConfigError(f"{where}: key {k!r} is given twice")
        else:
            into[k] = v


def storage_options_from_spark(options: Mapping[str, str], prefix: str = SPARK_PREFIX) -> dict:
    """fsspec storage options from Spark options named `fs.<name>` (e.g. fs.endpoint_url, fs.key).

    Values that parse as JSON are decoded (objects, numbers, true/false); dotted names nest
    (`fs.client_kwargs.region_name`). Keys are matched case-insensitively, as Spark passes them.
    """
    out: dict = {}
    for k, v in options.items():
        lk = str(k).lower()
        if not lk.startswith(prefix) or len(lk) == len(prefix):
            continue
        name = lk[len(prefix) :]
        _put(out, name, _decode(name, v), "Spark option")
    return out


def storage_options_from_cli(pairs: Iterable[str] | None) -> dict:
    """fsspec storage options from repeated `--fs key=value` flags (same decoding as the Spark form)."""
    out: dict = {}
    for pair in pairs or ():
        name, sep, value = str(pair).partition("=")
        name = name.strip()
        if not sep or not name:
            shown = name if sep else "<hidden>"  # a bare token may be a pasted secret: never echo it
            raise InvalidConfigError(f"--fs {shown}: expected key=value")
        _put(out, name, _decode(name, value), "--fs")
    return out


def redact(options: Any) -> Any:
    """A copy of storage options with every secret value replaced by '***' (nested dicts and lists too)."""
    if isinstance(options, Mapping):
        return {k: (REDACTED if is_secret_key(k) and v is not None else redact(v)) for k, v in options.items()}
    if isinstance(options, (list, tuple)):
        return type(options)(redact(v) for v in options)
    if isinstance(options, str):
        return redact_url(options)
    return options


def redact_url(url: str) -> str:
    """The URL without any user:password@ part."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", url)


def secret_values(options: Any) -> set[str]:
    """Every secret string held in storage options (for scrubbing messages from the backend)."""
    found: set[str] = set()

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, secret or is_secret_key(k))
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, secret)
        elif secret and node is not None and len(str(node)) >= 4:  # shorter values would scrub ordinary text
            found.add(str(node))

    walk(options, False)
    return found


def redact_text(text: str, options: Any = None) -> str:
    """Text with user:password@ parts of URLs and every secret value of `options` replaced by '***'."""
    text = redact_url(str(text))
    for s in sorted(secret_values(options), key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


def safe_repr(options: Any) -> str:
    """repr() of storage options for logs and error messages, secrets redacted."""
    return repr(redact(options))
