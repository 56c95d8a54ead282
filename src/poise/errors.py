"""User-facing errors: one line naming the offending value and the fix, non-zero exit."""

from __future__ import annotations


class PoiseError(Exception):
    """An error caused by the user's input. The CLI prints `poise: error: <message>` and exits 2."""

    exit_code = 2


class ConfigError(PoiseError):
    """A config key, type or value is not allowed."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}': got {value!r}; {allowed}")


class DataError(PoiseError):
    """A malformed dataset row or file; the message carries file:line."""
