r"""The one leak matcher: does a text name one of the users' private values, in any spelling?

An evolved prompt is registered, exported and deployed for everyone, so a candidate naming one
user's value (any state value of any period, superseded ones too; the name; identifying profile
fields and the places, people and organisations the profile names: `UserItem.private_values`)
is never taken. The optimizer layer checks every candidate of every optimizer with it
(`optimize.contract.propose`, `RunContext.check_no_leak`) and every starting prompt a run is
given (`runs.inputs.check_starting_prompts`).

Both the text and each value are *folded* before they are compared, so a re-spelling matches.
Where a maintained library holds the data, it is used, not a table kept here:

- escapes decoded first: percent-encoding (``city%20centre``), ``\u`` / ``\x`` escapes and
  HTML entities (``&#99;ity``, ``caf&eacute;``);
- Unicode: NFKC (full-width letters, ligatures), diacritics stripped (``shâred``), invisible
  format characters (zero-width spaces, soft hyphens) dropped; every other non-ASCII letter is
  read as the ASCII letters Unicode's confusables data says it looks like (the `confusables`
  package: Cyrillic ``с``, Greek ``ϲ``, ``ϳ``, ``ү``; a letter that looks like several, ``ӏ`` as
  ``i`` or ``l``, is tried both ways), or else as its transliteration (`anyascii`: ``к``,
  ``ø``, ``ß``, ``þ``);
- case, separators (``_``, ``-``, spaces, punctuation) and camelCase; possessives (``'s``) are
  dropped, so ``a bachelor's degree`` holds no word between ``bachelor`` and ``degree``;
- number words and digits (``two children`` for ``2_children``; ``twenty-one`` for ``21``),
  for 0-99;
- British and American spellings (``city center`` for ``city_centre``: the `breame` package's
  word lists) and English plurals and singulars (``lives`` for ``life``, ``houses``,
  ``children``: the `inflect` package): each word is reduced to its American singular;
- words run together (``paperbooks``, ``onlinecourses``) or split (``jig saw puzzles``);
- words in between: a value of several words is named when all of its words occur in order
  with at most `GAP` other words between them (``shared (big) house``);
- a digit inside a word is also read as the letters the confusables data says it looks like
  (``c1ty c3ntre``: 0, 1, 3 and 5; a digit on its own is a number, ``2_children``).

Not folded: leetspeak beyond those digits (``4`` for ``a``, ``7`` for ``t``: the data has no
such look-alike) and paraphrase (``a home shared with others``). The optimizer never sees a
private value in the first place (`Redactor`, which finds values with this same folding,
replaces them with placeholders before any text reaches an optimizer model); this check is the
backstop on what comes back.

A value shorter than `MIN_CHARS` letters and digits ("no", "2", "tea") or one of a few function
words (`COMMON`: "none", "other", ...) is too common to tell one user apart and is skipped. What an
allowed text already names (memloop's own seed prompt, or a starting prompt whose values the
user accepted) is not a leak.
"""

from __future__ import annotations

import html
import itertools
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

MIN_CHARS = 4  # letters and digits a value needs to be checked
GAP = 2  # other words a multi-word value's words may have between them
COMMON = frozenset(
    {"none", "nothing", "never", "other", "others", "some", "unknown", "always", "sometimes"}
)
"""Single-word values that are function words: never a leak on their own."""

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
# "'s" after a word: dropped (replaced by as many spaces, so positions in the text hold)
_POSSESSIVE = re.compile(r"(?<=[^\W_])['\u2019\u02bc]s\b")
# escapes decoded before folding: runs of percent-encoded bytes, \\u / \\U / \\x escapes, HTML
# character references
_ESCAPE = re.compile(
    r"(?:%[0-9A-Fa-f]{2})+|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8}|\\x[0-9A-Fa-f]{2}"
    r"|&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
)
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
_UNITS += "fifteen sixteen seventeen eighteen nineteen"
_NUMBERS = {w: str(i) for i, w in enumerate(_UNITS.split())}
_TENS = {w: str(10 * i) for i, w in enumerate("twenty thirty forty fifty sixty seventy".split(), 2)}
_TENS |= {"eighty": "80", "ninety": "90"}
MAX_READINGS = 8
"""Readings of one word tried at most (a word of several letters that each look like two)."""


def _decoded(escape: str) -> str:
    """One escape of `_ESCAPE` as the text it stands for (itself when it stands for nothing)."""
    if escape.startswith("%"):
        return urllib.parse.unquote(escape, errors="replace")
    if escape.startswith("&"):
        return html.unescape(escape)
    try:
        return chr(int(escape[2:], 16))
    except (ValueError, OverflowError):
        return escape


@lru_cache(maxsize=4096)
def _looks_like(c: str) -> list[str]:
    """The ASCII letters a character looks like, its transliteration first; case kept.

    From Unicode's confusables data (the `confusables` package): "ϲ" -> c, "ӏ" -> i or l.
    """
    from anyascii import anyascii
    from confusables import normalize

    looks = [r for r in normalize(c, prioritize_alpha=True) if r.isascii() and r.isalpha()]
    spelled = anyascii(c).lower()
    if spelled in looks:
        looks = [spelled, *(r for r in looks if r != spelled)]
    return [r.upper() if c.isupper() else r for r in looks]


@lru_cache(maxsize=4096)
def _letter_readings(c: str) -> tuple[str, ...]:
    """The ASCII spellings a non-ASCII letter may be read as.

    What it looks like (`_looks_like`), else its transliteration (`anyascii`: "к" -> "k").
    """
    from anyascii import anyascii

    return tuple(_looks_like(c)) or (anyascii(c) or c,)


@lru_cache(maxsize=65536)
def _fold_char(c: str) -> tuple[str, ...]:
    """One character's folded readings; the first is the plain fold.

    A look-alike letter reads as the ASCII letters it looks like; any other character is
    NFKC-normalized, its marks and format characters dropped, its non-ASCII letters read as
    ASCII (`_letter_readings`).
    """
    if not c.isascii() and unicodedata.category(c)[0] == "L":
        looks = _looks_like(c)  # before NFKC: it turns the lunate "ϲ" into a sigma
        if looks:
            return tuple(looks)
    kept = [
        d
        for d in unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", c))
        if unicodedata.category(d) not in ("Mn", "Cf")
    ]
    if all(d.isascii() for d in kept):
        return ("".join(kept),)
    per = [
        _letter_readings(d) if not d.isascii() and unicodedata.category(d)[0] == "L" else (d,)
        for d in kept
    ]
    return tuple(itertools.islice(("".join(p) for p in itertools.product(*per)), MAX_READINGS))


@dataclass(frozen=True)
class _Unit:
    """A folded character: its readings, and the span of the text it comes from."""

    readings: tuple[str, ...]
    start: int
    end: int


def _units(text: str) -> list[_Unit]:
    """`text` decoded (`_ESCAPE`) and folded one character at a time."""
    units: list[_Unit] = []
    done = 0
    for m in [*_ESCAPE.finditer(text), None]:
        upto = m.start() if m else len(text)
        units += [_Unit(_fold_char(c), i, i + 1) for i, c in enumerate(text[done:upto], done)]
        if m:
            units += [_Unit(_fold_char(c), m.start(), m.end()) for c in _decoded(m.group())]
            done = m.end()
    return units


def _plain(text: str) -> bool:
    """Whether `text` folds to itself: ASCII with nothing to decode."""
    return text.isascii() and _ESCAPE.search(text) is None


def fold(text: str) -> str:
    """`text` decoded and with look-alike letters, diacritics and invisible characters folded.

    Case is kept (camelCase still splits words); `words` lower-cases. Where a letter has
    several readings, the first.
    """
    if _plain(text):
        return text
    return "".join(u.readings[0] for u in _units(text))


@dataclass(frozen=True)
class _Token:
    text: str  # folded, lower-case; number words as digits
    start: int  # its span in the original text
    end: int
    readings: tuple[str, ...]  # every reading of it, `text` first


def _raw_tokens(text: str) -> list[_Token]:
    """`text`'s folded, lower-case words with their spans in `text`, numbers as written."""
    spans: list[tuple[int, int]] = []  # per folded character: its span in `text` (if not plain)
    if _plain(text):
        folded, readings = text, None
    else:
        units = _units(text)
        chars: list[str] = []
        owner = []  # per folded character: the unit it comes from
        for k, u in enumerate(units):
            for f in u.readings[0]:
                chars.append(f)
                spans.append((u.start, u.end))
                owner.append(k)
        folded, readings = "".join(chars), (units, owner)
    folded = _POSSESSIVE.sub(lambda m: " " * len(m.group()), folded)
    found: list[_Token] = []
    for m in _WORD.finditer(folded):
        at = m.start()
        for part in _CAMEL.split(m.group()):
            if part:
                first, last = at, at + len(part) - 1
                alternatives: tuple[str, ...] = (part.casefold(),)
                if readings is not None:
                    units, owner = readings
                    ks = list(dict.fromkeys(owner[first : last + 1]))
                    if any(len(units[k].readings) > 1 for k in ks):
                        combos = itertools.product(*(units[k].readings for k in ks))
                        spelled = ("".join(c).casefold() for c in combos)
                        alternatives = _first_unique(
                            itertools.chain([part.casefold()], spelled), MAX_READINGS
                        )
                if not part.isalpha() and not part.isdigit():  # "c1ty": a digit in a word
                    alternatives = _leet(alternatives)
                start, end = (spans[first][0], spans[last][1]) if spans else (first, last + 1)
                found.append(_Token(part.casefold(), start, end, alternatives))
            at += len(part)
    return found


def _leet(readings: tuple[str, ...]) -> tuple[str, ...]:
    """`readings` of a word of letters and digits, with its digits read as letters too.

    A digit reads as the letters Unicode's confusables data says it looks like: "c1ty" ->
    "city", "clty"; "0" as "o", "3" as "e".
    """
    per_reading = (
        itertools.product(
            *((ch, *(x.lower() for x in _looks_like(ch))) if ch.isdigit() else (ch,) for ch in r)
        )
        for r in readings
    )
    spelled = ("".join(c) for combos in per_reading for c in combos)
    return _first_unique(spelled, MAX_READINGS)


def _first_unique(items: Iterable[str], n: int) -> tuple[str, ...]:
    """The first `n` distinct `items`, taken lazily.

    A word of many ambiguous letters or digits (a hash, an id) has more readings than could
    ever be listed.
    """
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item)
        if len(seen) == n:
            break
    return tuple(seen)


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


def _located_tokens(text: str) -> list[_Token]:
    """`text`'s tokens with their spans and readings, number words as digits.

    "twenty one" is one token "21" spanning both words.
    """
    found = _raw_tokens(text)
    out: list[_Token] = []
    for word, a, b in _number_groups([t.text for t in found]):
        if a != b:
            out.append(_Token(word, found[a].start, found[b].end, (word,)))
        else:
            t = found[a]
            readings = (_NUMBERS.get(r) or _TENS.get(r) or r for r in t.readings)
            out.append(_Token(word, t.start, t.end, tuple(dict.fromkeys([word, *readings]))))
    return out


@lru_cache(maxsize=1)
def _inflect() -> Any:
    """The engine of `inflect`, its module imported without typeguard's instrumentation.

    inflect 7 wraps its functions in typeguard's `@typechecked`, which parses and rewrites their
    source at import: about 3 s per process here (jaraco/inflect#212, open), paid again by every
    CLI subprocess, and a type check on every call. memloop passes it words of 4+ letters only,
    so while inflect is imported `typeguard.typechecked` is the identity (the same stems: tested).
    """
    import sys
    import types

    if "inflect" not in sys.modules:
        real = sys.modules.get("typeguard")
        stub = types.ModuleType("typeguard")
        stub.typechecked = lambda target=None, **_: (lambda f: f) if target is None else target  # type: ignore[attr-defined]
        sys.modules["typeguard"] = stub
        try:
            import inflect  # the module, into sys.modules
        finally:
            if real is None:
                del sys.modules["typeguard"]
            else:
                sys.modules["typeguard"] = real
    import inflect

    return inflect.engine()


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A word's American singular: what its spellings share.

    British and American, singular and plural: "centres", "centre", "center" -> "center";
    "lives" -> "life"; "children" -> "child".

    British spellings are read from the `breame` package's lists, singulars from `inflect`'s rules
    (applied to every word: a verb may be cut too, "does" -> "doe", the same way everywhere).
    Words of three letters or fewer and numbers are kept.
    """
    from breame.spelling import get_american_spelling

    if len(word) <= 3 or word.isdigit():
        return word
    word = get_american_spelling(word)  # "centres" -> "centers"
    singular = _inflect().singular_noun(word)
    # "neighbourhoods" -> "neighbourhood" -> "neighborhood"
    return get_american_spelling(singular) if isinstance(singular, str) and singular else word


def tokens(text: str, numbers: bool = True) -> list[str]:
    """`text`'s folded, lower-case words, number words as digits unless not `numbers`.

    Not stemmed.
    """
    ts = [t.text for t in _raw_tokens(text)]
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


def _gapped_end(ws: list[tuple[str, ...]], i: int, v: _Value) -> int | None:
    """Where `v`'s stemmed words end in `ws` when they occur in order from word i.

    `ws` holds each word's stemmed readings. At most GAP other words may stand between them in
    all; None when they do not occur so.
    """
    at, gaps = i, 0
    for w in v.words[1:]:
        nxt = next(
            (j for j in range(at + 1, at + 2 + GAP - gaps) if j < len(ws) and w in ws[j]), None
        )
        if nxt is None:
            return None
        gaps += nxt - at - 1
        at = nxt
    return at


def _stems(ts: list[_Token]) -> list[tuple[str, ...]]:
    """Each token's stemmed readings."""
    return [tuple(dict.fromkeys(stem(r) for r in t.readings)) for t in ts]


def _run_keys(ts: list[_Token]) -> Iterable[str]:
    """The keys of a run of consecutive tokens, every reading of each (`MAX_READINGS` at most)."""
    if all(len(t.readings) == 1 for t in ts):
        return _joined([t.text for t in ts])
    combos = itertools.islice(itertools.product(*(t.readings for t in ts)), MAX_READINGS)
    return {key for combo in combos for key in _joined(list(combo))}


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
                    # a stem shorter than a checked value ("Mars" -> "mar") would name "Mar"
                    if len(key) >= MIN_CHARS:
                        self.keys.setdefault(key, set()).add(value)
            self.longest = max(self.longest, len(ts))
            if len(ts) > 1:
                v = _Value(value, tuple(stem(t) for t in ts))
                self.multi.setdefault(v.words[0], []).append(v)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def _spelled(self, ts: list[_Token]) -> set[str]:
        """Values spelled by a run of consecutive words (run together or as separate words)."""
        found: set[str] = set()
        longest = self.longest + 2  # a value's word may be written as two ("jig saw")
        for i in range(len(ts)):
            for n in range(1, min(longest, len(ts) - i) + 1):
                for key in _run_keys(ts[i : i + n]):
                    found |= self.keys.get(key, set())
        return found

    def _starting(self, ws: list[tuple[str, ...]], i: int) -> list[_Value]:
        """The values of several words whose first word is a reading of word i."""
        return [v for first in ws[i] for v in self.multi.get(first, ())]

    def _spaced(self, ws: list[tuple[str, ...]]) -> set[str]:
        """Values of several words whose words occur in order with at most GAP between them."""
        found: set[str] = set()
        for i in range(len(ws)):
            for v in self._starting(ws, i):
                if v.value not in found and _gapped_end(ws, i, v) is not None:
                    found.add(v.value)
        return found

    def named_in(self, text: str) -> set[str]:
        """Every indexed value `text` names."""
        if not self.keys:
            return set()
        ts = _located_tokens(text)
        return self._spelled(ts) | self._spaced(_stems(ts))

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

    def _match_at(
        self, ts: list[_Token], stems: list[tuple[str, ...]], i: int
    ) -> tuple[int, str] | None:
        """(the last token, the value) of the longest value spelled from token i, or None."""
        longest = self.index.longest + 2
        for n in range(min(longest, len(ts) - i), 0, -1):
            for key in _run_keys(ts[i : i + n]):
                values = self.index.keys.get(key)
                if values:
                    return i + n - 1, min(values, key=lambda v: (-len(v), v))
        best: tuple[int, str] | None = None
        for v in self.index._starting(stems, i):
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
        stems = _stems(ts)
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
