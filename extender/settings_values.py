"""One setting's value read from where it was given: a flag's or a variable's text, or a config file's YAML
(`settings.load` decides which wins). A value of the wrong kind is a `SettingsError` naming its source."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import yaml

from extender.core.errors import UserError


class SettingsError(UserError):
    """A setting that is missing, malformed or inconsistent; the message names it and its source."""


def convert(field: dataclasses.Field[Any], value: Any, source: str) -> Any:
    kind: type[Any] = type(field.default)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in {"1", "true", "yes", "on"}:
                return True
            if text in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError("expected true or false")
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected a whole number")
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if issubclass(kind, enum.Enum):
            return kind(str(value))
        if not isinstance(value, (str, int, float)):
            raise ValueError("expected a string")
        return str(value)
    except ValueError as error:
        choices = f" (one of: {', '.join(member.value for member in kind)})" if issubclass(kind, enum.Enum) else ""
        raise SettingsError(f"{source}={value!r}: {error}{choices}") from None


def read_config(path: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise SettingsError(f"config file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"config file {path}: not YAML or JSON: {error}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"config file {path}: expected a mapping of setting names to values")
    return {str(key).replace("-", "_"): value for key, value in loaded.items()}
