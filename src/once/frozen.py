"""Frozen: the base of the small immutable records `once run` builds on every cron fire
(Period, Job, Claim, Target, core's Result).

It gives what `@dataclass(frozen=True)` gives them (equality and hash by their fields, a repr
naming them, no assignment after __init__) without its cost at import: a frozen dataclass
compiles six methods when its module loads, about half a millisecond a class, paid by every
fire, skip or run. A subclass declares its fields, in order, as annotations, and its
__init__ stores them with `_set` in that order (the order of eq, hash and repr).

A leaf: imports nothing.
"""

from __future__ import annotations

from typing import NoReturn


class Frozen:
    def _set(self, **fields: object) -> None:
        """Store the fields (from __init__ only: afterwards the record is frozen)."""
        self.__dict__.update(fields)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash(tuple(self.__dict__.values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self.__dict__.items())
        return f"{type(self).__qualname__}({fields})"
