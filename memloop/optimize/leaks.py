"""The one leak check: no user's private value enters a prompt shared by every user.

An evolved prompt is registered, exported and deployed for everyone, so a candidate naming one
user's value (any state value of any period, superseded ones too; the name; identifying profile
fields: `UserItem.private_values`) is never taken. The check is made by the optimizer layer on
every candidate of every optimizer: `contract.propose` on each proposal and on each prompt an
evolver sends to the replay screen, and `RunContext` on every cycle a search yields (a third-party
search that bypasses `propose` is stopped before anything is registered).

Matching sees through re-spellings: case, `_`, `-`, spaces and other punctuation, camelCase,
words run together ("paperbooks") and a simple plural ("paper book" for `paper_books`). A value
shorter than 4 letters and digits ("no", "2", "tea") is too common to tell apart and is skipped; a
value the text it replaces already held (the author's seed prompt) is not a leak.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_CHARS = 4  # letters and digits a value needs to be checked
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_WORD = re.compile(r"[^0-9a-z]+")


def _singular(word: str) -> str:
    if len(word) > 4 and word.endswith(("ses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """`text` as lower-case singular words: "ActivelyMoving" and "actively_moving" agree."""
    return [_singular(w) for w in _NOT_WORD.sub(" ", _CAMEL.sub(" ", text).lower()).split()]


def _forms(text: str, longest: int) -> set[str]:
    """Every run of 1..`longest` consecutive words of `text`, joined without spaces."""
    ws = words(text)
    return {"".join(ws[i : i + n]) for n in range(1, longest + 1) for i in range(len(ws) - n + 1)}


class _Index:
    """Private values by their matching key (letters and digits of their singular words)."""

    def __init__(self, values: Iterable[str]):
        self.keys: dict[str, list[str]] = {}
        self.longest = 1  # words in the longest checked value
        for value in set(values):
            ws = words(value)
            key = "".join(ws)
            if len(key) >= MIN_CHARS:
                self.keys.setdefault(key, []).append(value)
                self.longest = max(self.longest, len(ws))

    def named(self, text: str, allowed: str = "") -> list[str]:
        if not self.keys:
            return []
        found = _forms(text, self.longest) & self.keys.keys()
        if found and allowed:
            found -= _forms(allowed, self.longest)
        return sorted(v for key in found for v in self.keys[key])


def named(text: str, values: Iterable[str], allowed: str = "") -> list[str]:
    """The `values` that `text` names (sorted), leaving out those `allowed` already names."""
    return _Index(values).named(text, allowed)


@dataclass
class LeakCheck:
    """The leak check of one proposal: the private values it bans and the rejections it made.

    The values are indexed once, not again for every text checked.
    """

    private: frozenset[str]
    rejected: int = field(default=0)
    _index: _Index = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = _Index(self.private)

    def names(self, text: str, allowed: str = "") -> list[str]:
        """The private values `text` names that `allowed` (the text it replaces) did not."""
        return self._index.named(text, allowed)

    def reject(self, text: str, allowed: str = "") -> int:
        """How many private values `text` names beyond `allowed`; non-zero is a rejection."""
        hits = len(self.names(text, allowed))
        if hits:
            self.rejected += 1
        return hits


def described(hits: int) -> str:
    """What a rejection says: a count, never the values (steps are logged to MLflow)."""
    return f"names {hits} private value{'s' if hits != 1 else ''} of the users"
