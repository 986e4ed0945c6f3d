"""Content words: the words of a text that carry a fact.

One home for AWI's grounding check and the named write failures.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[0-9a-z]+")
_FILLER = frozenset(
    "the and for with from that this they their them she her his him its are was were has have "
    "had not now currently user users about into than then there here very also yes true false "
    "none".split()
)


def content_words(text: str) -> set[str]:
    """The lower-cased words of `text` of 3 characters or more that are not filler."""
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _FILLER}
