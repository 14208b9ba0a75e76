"""The package's settings from Python, in the style of `keras.config`.

Every setting is also an environment variable `KERAS_MPFP16_<NAME>` (see
docs/configuration.md); a value set here wins over the variable, in this
process only (processes started later, and other ranks, do not see it: set it
on every rank, as the script runs on every rank). Each setting is read at a
known moment (the reference's "Read" column): a value set after that moment
applies from the next read, e.g. `stall_timeout` is read at `kmp.init()`.

Example:

```python
import keras_mpfp16 as kmp

kmp.config.set("evaluate_wait", 30)     # before kmp.init() / the optimizer
kmp.config.get("evaluate_wait")         # 30.0
kmp.config.get("KERAS_MPFP16_STALL_TIMEOUT")  # the full name works too
kmp.config.reset("evaluate_wait")       # back to the environment / default
```
"""

from __future__ import annotations

from typing import Any

from keras_mpfp16 import _settings as env


def get(name: str) -> Any:
    """The current value of a setting.

    Args:
        name: the setting, e.g. `"evaluate_wait"` (any case) or the full
            environment variable name `"KERAS_MPFP16_EVALUATE_WAIT"`.

    Returns:
        The value set with `set` in this process, else the environment
        variable's (parsed to the setting's type), else the default (`None`
        for a setting decided automatically, such as `cuda_aware`).

    Raises:
        ValueError: for an unknown name, or an environment variable whose
            text is not a valid value (the message names both).
    """
    return env.get(name)


def set(name: str, value: Any) -> None:
    """Sets a setting in this process; it wins over the environment variable.

    Args:
        name: as for `get`.
        value: a value of the setting's type (`True`/`False`, seconds, one of
            the allowed words) or its text as in the environment variable.
            `None` removes what was set.

    Raises:
        ValueError: for an unknown name, a bad value, or a setting read at
            import (`threads`), which only the environment variable can set.
    """
    env.set(name, value)


def reset(name: str | None = None) -> None:
    """Forgets what `set` set, for `name` or (without it) for every setting."""
    env.reset(name)


def settings() -> dict[str, Any]:
    """Every setting's current value, by lower-case name.

    Example:

    ```python
    >>> kmp.config.settings()["stall_timeout"]
    60.0
    ```
    """
    return {s.key.lower(): env.get(s.key) for s in env.settings()}


__all__ = ["get", "reset", "set", "settings"]
