"""The one leak matcher: does a text name one of the users' private values, in any spelling?

An evolved prompt is registered, exported and deployed for everyone, so a candidate naming one
user's value (any state value of any period, superseded ones too; the name; identifying profile
fields and the places, people and organisations the profile names: `UserItem.private_values`)
is never taken. The optimizer layer checks every candidate of every optimizer with it
(`optimize.contract.propose`, `RunContext.check_no_leak`) and every starting prompt a run is
given (`runs.inputs.check_starting_prompts`).

Both the text and each value are *folded* before they are compared, so a re-spelling matches:

- Unicode: NFKC (full-width letters, ligatures), common Cyrillic and Greek look-alikes of Latin
  letters, diacritics stripped (``shâred``), invisible format characters (zero-width spaces,
  soft hyphens) dropped, letters such as ``ø``, ``æ``, ``ß`` written out;
- case, separators (``_``, ``-``, spaces, punctuation) and camelCase;
- number words and digits (``two children`` for ``2_children``; ``twenty-one`` for ``21``),
  for 0-99;
- English plurals (``houses``, ``boxes``, ``churches``, ``parties``, ``children``): each word is
  reduced to a stem that its singular and plural share;
- words run together (``paperbooks``, ``onlinecourses``) or split (``jig saw puzzles``);
- words in between: a value of several words is named when all of its words occur in order
  with at most `GAP` other words between them (``shared (big) house``).

A value shorter than `MIN_CHARS` letters and digits ("no", "2", "tea") or one of a few function
words (`COMMON`: "none", "other", ...) is too common to tell one user apart and is skipped. What an
allowed text already names (memloop's own seed prompt, or a starting prompt whose values the
user accepted) is not a leak.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MIN_CHARS = 4  # letters and digits a value needs to be checked
GAP = 2  # other words a multi-word value's words may have between them
COMMON = frozenset(
    {"none", "nothing", "never", "other", "others", "some", "unknown", "always", "sometimes"}
)
"""Single-word values that are function words: never a leak on their own."""

# Cyrillic and Greek letters drawn like Latin ones, and Latin letters NFKD does not decompose
_LOOKALIKES = str.maketrans(
    {
        **dict(
            zip("АВЕЗІЈКМНОРСТУХЅԁаезіјорсухѕһԛԝ", "ABEZIJKMHOPCTYXSdaezijopcyxshqw", strict=True)
        ),
        **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧαεικνορτυχ", "ABEZHIKMNOPTYXaeikvoptux", strict=True)),
        "ø": "o",
        "Ø": "O",
        "ł": "l",
        "Ł": "L",
        "đ": "d",
        "Đ": "D",
        "ı": "i",
        "æ": "ae",
        "Æ": "Ae",
        "œ": "oe",
        "Œ": "Oe",
        "ß": "ss",
        "þ": "th",
    }
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
_UNITS += "fifteen sixteen seventeen eighteen nineteen"
_NUMBERS = {w: str(i) for i, w in enumerate(_UNITS.split())}
_TENS = {w: str(10 * i) for i, w in enumerate("twenty thirty forty fifty sixty seventy".split(), 2)}
_TENS |= {"eighty": "80", "ninety": "90"}
_IRREGULAR = {
    "children": "child",
    "people": "person",
    "men": "man",
    "women": "woman",
    "feet": "foot",
    "teeth": "tooth",
    "mice": "mouse",
    "geese": "goose",
}


def fold(text: str) -> str:
    """`text` with look-alike letters, diacritics and invisible characters normalized away.

    Case is kept (camelCase still splits words); `words` lower-cases.
    """
    text = unicodedata.normalize("NFKC", text).translate(_LOOKALIKES)
    kept = (c for c in unicodedata.normalize("NFKD", text) if unicodedata.category(c) != "Mn")
    # format characters (zero-width space, soft hyphen) join what they split
    return "".join(c for c in kept if unicodedata.category(c) != "Cf")


def _number_groups(tokens: list[str]) -> list[tuple[str, int, int]]:
    """Number words as digits, each with the first and last index of its tokens.

    "twenty one" -> ("21", 0, 1), "two" -> ("2", 0, 0).
    """
    out: list[tuple[str, int, int]] = []
    for i, t in enumerate(tokens):
        if t in _NUMBERS and out and out[-1][0] in _TENS.values() and int(_NUMBERS[t]) < 10:
            out[-1] = (str(int(out[-1][0]) + int(_NUMBERS[t])), out[-1][1], i)
        else:
            out.append((_NUMBERS.get(t) or _TENS.get(t) or t, i, i))
    return out


def _numbers(tokens: list[str]) -> list[str]:
    """Number words as digits: "twenty one" -> "21", "two" -> "2"."""
    return [word for word, _, _ in _number_groups(tokens)]


def stem(word: str) -> str:
    """A stem that a word's singular and plural share ("house"/"houses" -> "hous").

    Not a linguist's stem: only what makes plurals meet. "parties" and "party" -> "parti",
    "boxes" and "box" -> "box", "cookies" and "cookie" -> "cooki", "children" -> "child".
    """
    if word in _IRREGULAR:
        return _IRREGULAR[word]
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ies"):
        word = word[:-1] if len(word) == 4 else word[:-3] + "y"  # ties -> tie; parties -> party
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]  # houses -> house, boxes -> boxe, cats -> cat
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]  # house -> hous, boxe -> box
    if len(word) > 3 and word.endswith("y"):
        word = word[:-1] + "i"  # party -> parti
    return word


def tokens(text: str, numbers: bool = True) -> list[str]:
    """`text`'s folded, lower-case words, number words as digits unless not `numbers`.

    Not stemmed.
    """
    ts = _WORD.findall(_CAMEL.sub(" ", fold(text)).casefold())
    return _numbers(ts) if numbers else ts


_DIGIT_WORDS = {d: w for w, d in _NUMBERS.items()}


def _spellings(value: str) -> list[list[str]]:
    """A value's words with numbers as digits, as written, and as words ("2"/"two")."""
    ts = tokens(value)
    return [ts, tokens(value, numbers=False), [_DIGIT_WORDS.get(t, t) for t in ts]]


def words(text: str) -> list[str]:
    """`text` as stemmed words: "ActivelyMoving" and "actively_moving" agree."""
    return [stem(t) for t in tokens(text)]


def _joined(ts: list[str]) -> set[str]:
    """The keys of consecutive words `ts` run together: as written, last word stemmed, all."""
    return {"".join(ts), "".join(ts[:-1]) + stem(ts[-1]), "".join(stem(t) for t in ts)}


@dataclass(frozen=True)
class _Value:
    value: str
    words: tuple[str, ...]  # stemmed


def _gapped_end(ws: list[str], i: int, v: _Value) -> int | None:
    """Where `v`'s stemmed words end in `ws` when they occur in order from word i.

    At most GAP other words may stand between them in all; None when they do not occur so.
    """
    at, gaps = i, 0
    for w in v.words[1:]:
        nxt = next(
            (j for j in range(at + 1, at + 2 + GAP - gaps) if j < len(ws) and ws[j] == w), None
        )
        if nxt is None:
            return None
        gaps += nxt - at - 1
        at = nxt
    return at


class ValueIndex:
    """Private values, indexed once for every text checked against them."""

    def __init__(self, values: Iterable[str]):
        self.keys: dict[str, set[str]] = {}  # a joined key -> the values it spells
        self.multi: dict[str, list[_Value]] = {}  # first stemmed word -> values of 2+ words
        self.longest = 1  # words in the longest checked value
        for value in set(values):
            ts = tokens(value)
            if len("".join(ts)) < MIN_CHARS or (len(ts) == 1 and ts[0] in COMMON):
                continue
            for spelling in _spellings(value):  # run together, a number is one token
                for key in _joined(spelling):
                    self.keys.setdefault(key, set()).add(value)
            self.longest = max(self.longest, len(ts))
            if len(ts) > 1:
                v = _Value(value, tuple(stem(t) for t in ts))
                self.multi.setdefault(v.words[0], []).append(v)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def _spelled(self, ts: list[str]) -> set[str]:
        """Values spelled by a run of consecutive words (run together or as separate words)."""
        found: set[str] = set()
        longest = self.longest + 2  # a value's word may be written as two ("jig saw")
        for i in range(len(ts)):
            for n in range(1, min(longest, len(ts) - i) + 1):
                for key in _joined(ts[i : i + n]):
                    found |= self.keys.get(key, set())
        return found

    def _spaced(self, ws: list[str]) -> set[str]:
        """Values of several words whose words occur in order with at most GAP between them."""
        found: set[str] = set()
        for i, first in enumerate(ws):
            for v in self.multi.get(first, ()):
                if v.value not in found and _gapped_end(ws, i, v) is not None:
                    found.add(v.value)
        return found

    def named_in(self, text: str) -> set[str]:
        """Every indexed value `text` names."""
        if not self.keys:
            return set()
        ts = tokens(text)
        return self._spelled(ts) | self._spaced([stem(t) for t in ts])

    def named(self, text: str, allowed: str = "") -> list[str]:
        """The values `text` names (sorted), leaving out those `allowed` already names."""
        found = self.named_in(text)
        if found and allowed:
            found -= self.named_in(allowed)
        return sorted(found)


def named(text: str, values: Iterable[str], allowed: str = "") -> list[str]:
    """The `values` that `text` names (sorted), leaving out those `allowed` already names."""
    return ValueIndex(values).named(text, allowed)


# Sentence openers that are capitalized because they open a sentence, not because they are names
_OPENERS = frozenset(
    """a an the he she they we i it its his her hers their this that these those there here
    in on at as after before when while since although though because with without for from to
    of by over during outside besides beyond apart also additionally however despite yet but and
    or so then now today currently recently most many some each every both one two known even
    whether if once until unlike like being having what who whose which where how why all any
    no not nor only still just never always often sometimes usually generally overall""".split()
)
_CALENDAR = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday january february march april may
    june july august september october november december""".split()
)
_CAPITALIZED = re.compile(
    r"[A-Z][\w'’-]*(?:\s+(?:of|de|la|le|van|von|da|del|the)?\s*[A-Z][\w'’-]*)*"
)
_SENTENCE_START = re.compile(r"(?:^|[.!?;:]\s+|\n\s*)$")


def proper_nouns(text: str) -> set[str]:
    """The names a free text gives: places, people, organisations ("Bergen", "New York").

    A run of capitalized words is a name, taken whole (weekdays and months are not). At the start
    of a sentence a capital says nothing, so a single opening word counts only when it is not
    a common opener ("She", "After", ...) nor shaped like an adverb, a gerund or a participle
    ("Professionally", "Growing", "Raised").
    """
    found: set[str] = set()
    folded = fold(text)
    for m in _CAPITALIZED.finditer(folded):
        run = m.group(0).strip()
        parts = run.split()
        opening = bool(_SENTENCE_START.search(folded[: m.start()]))
        if opening and len(parts) == 1:
            word = run.lower()
            if word in _OPENERS or word.endswith(("ly", "ing", "ed")) or len(word) < MIN_CHARS:
                continue
        if opening and parts[0].lower() in _OPENERS:
            parts = parts[1:]  # "The University of Oslo" -> "University of Oslo"
            run = " ".join(parts)
        if len(re.sub(r"\W", "", run)) < MIN_CHARS or run.lower().removesuffix("s") in _CALENDAR:
            continue
        found.add(run)  # whole: "Times" of "New York Times" is a common word on its own
    return found


@dataclass
class LeakCheck:
    """The leak check of one proposal (or one run): the values it bans, the rejections it made.

    The values are indexed once, not again for every text checked.
    """

    private: frozenset[str]
    rejected: int = field(default=0)
    _index: ValueIndex = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = ValueIndex(self.private)

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


@dataclass(frozen=True)
class _Token:
    text: str  # folded, lower-case; number words as digits
    start: int  # its span in the original text
    end: int


def _located_tokens(text: str) -> list[_Token]:
    """`tokens(text)` with each token's span in `text` (folded one character at a time)."""
    chars: list[str] = []
    where: list[int] = []
    for i, c in enumerate(text):
        for f in fold(c):
            chars.append(f)
            where.append(i)
    folded = "".join(chars)
    found: list[_Token] = []
    for m in _WORD.finditer(folded):
        at = m.start()
        for part in _CAMEL.split(m.group()):
            if part:
                found.append(_Token(part.casefold(), where[at], where[at + len(part) - 1] + 1))
            at += len(part)
    # number words as digits, "twenty one" as one token "21" spanning both words
    groups = _number_groups([t.text for t in found])
    return [_Token(word, found[a].start, found[b].end) for word, a, b in groups]


class Redactor:
    """Replaces every spelling of a private value in a text with that value's typed placeholder.

    The optimizer reads feedback through it (feedback/summary.py): a value is never shown, only
    its kind (`[home_city #2]`: the variable and its option's place in the state schema). It
    finds values as the leak check does (`ValueIndex`: the same folding of Unicode, case,
    separators, numbers, plurals, run-together and split words, up to GAP words between a
    value's words) and replaces the whole span, the words in between included. Values the leak
    check skips (shorter than MIN_CHARS, function words) are left as written. Where a longer and
    a shorter value start at the same word, the longer is replaced.
    """

    def __init__(self, placeholders: dict[str, str]):
        self.placeholders = dict(placeholders)
        self.index = ValueIndex(self.placeholders)
        # a summary is rebuilt once per question its budget tries: each text is redacted once
        self._done: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.index)

    def _match_at(self, ts: list[_Token], stems: list[str], i: int) -> tuple[int, str] | None:
        """(the last token, the value) of the longest value spelled from token i, or None."""
        longest = self.index.longest + 2
        for n in range(min(longest, len(ts) - i), 0, -1):
            for key in _joined([t.text for t in ts[i : i + n]]):
                values = self.index.keys.get(key)
                if values:
                    return i + n - 1, min(values, key=lambda v: (-len(v), v))
        best: tuple[int, str] | None = None
        for v in self.index.multi.get(stems[i], ()):
            end = _gapped_end(stems, i, v)
            if end is not None and (best is None or end > best[0]):
                best = (end, v.value)
        return best

    def __call__(self, text: str) -> str:
        if not self.index or not text:
            return text
        done = self._done.get(text)
        if done is None:
            done = self._done[text] = self._redact(text)
        return done

    def _redact(self, text: str) -> str:
        ts = _located_tokens(text)
        stems = [stem(t.text) for t in ts]
        out: list[str] = []
        done, i = 0, 0
        while i < len(ts):
            hit = self._match_at(ts, stems, i)
            if hit is None:
                i += 1
                continue
            last, value = hit
            out += [text[done : ts[i].start], self.placeholders[value]]
            done, i = ts[last].end, last + 1
        out.append(text[done:])
        return "".join(out)

    def data(self, node: Any) -> Any:
        """`node` (a summary's JSON-like data) with every string redacted; keys are kept."""
        if isinstance(node, str):
            return self(node)
        if isinstance(node, dict):
            return {k: self.data(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [self.data(v) for v in node]
        return node
