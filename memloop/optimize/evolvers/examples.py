"""Worked examples for a memory writer: excerpts with the exact edits they call for.

Small writer models follow examples better than instructions ("exemplars matter more than
instructions"), and choosing how many examples a prompt shows needs no capable optimizer. The
examples here are an evolvable part of the writer prompt: the `edits` evolver adds or drops them
(optimize/evolvers/edits.py), the replay screen and the gate decide, and
benchmarks/examples_curve.py measures the curve over their number.

Where they come from, and why not from the environment's own users:

- They are **generated for the purpose** from a small catalogue of its own (`DEMO_KINDS`: a
  musical instrument, a language being learnt, podcasts, balcony plants, a collecting hobby)
  with their own seed. The procedural catalogue's values are shared by every simulated user, so
  an example drawn from a "demo user" of that catalogue would show a value that run users hold,
  and the 1.5B writer copies what its prompt shows into every user's memory. No kind here is a
  kind any environment asks about, and no text here names a value of the procedural catalogue in
  any spelling the leak matcher knows (tests/optimize/test_optimize_examples.py checks every
  value of every variable), so every run user's value stays out whatever the run's users are. A
  proposal carrying examples also passes the run's own leak check like any other.
- **Their edits are exact**: each example is built from a known state (the memory before, what
  the user says, what changed), so its edits are right by construction, not a model's guess.
- They show the failures the feedback names (feedback/write_failures.py): the user's words
  stored rather than the assistant's advice, an update under the label that holds the old value,
  two facts under two labels, and no edit when the user states nothing about themselves.

The block is appended to the instructions under `HEADER`, one example per line, written as text
(not JSON), so it travels with the prompt everywhere a prompt goes: the registry, the export,
mem0's custom prompts and the run key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HEADER = "Examples (the memory before, the excerpt, the edits it calls for):"
NORMALIZED_PHRASE = "short normalized phrase"
"""The words by which instructions ask for normalized values (the `normalized` edit operator's
sentence, optimize/evolvers/edits.py, is written with them): `with_examples` follows them."""
MAX_EXAMPLES = 4
"""How many distinct examples `write_examples` builds (one of each shape)."""


@dataclass(frozen=True)
class DemoValue:
    said: str  # the user's own sentence revealing it
    short: str  # the same fact as a short normalized phrase
    advice: str  # what the assistant answers (never a fact about the user)


@dataclass(frozen=True)
class DemoKind:
    label: str
    values: tuple[DemoValue, ...]


DEMO_KINDS: tuple[DemoKind, ...] = (
    DemoKind(
        "instrument_played",
        (
            DemoValue(
                "I've taken up the cello and practise for half an hour most evenings.",
                "cello, half an hour most evenings",
                "Short daily sessions build technique faster than long weekend ones.",
            ),
            DemoValue(
                "I strum my ukulele on the balcony every Sunday morning.",
                "ukulele, Sunday mornings",
                "Learning a few new chord shapes each week keeps it fresh.",
            ),
            DemoValue(
                "I play trumpet in a brass band that rehearses on Thursdays.",
                "trumpet in a brass band, Thursdays",
                "Lip slurs before rehearsal protect your embouchure.",
            ),
        ),
    ),
    DemoKind(
        "language_learning",
        (
            DemoValue(
                "I'm learning Portuguese with an evening tutor twice a week.",
                "Portuguese, tutor twice a week",
                "Speaking aloud between lessons helps the new words stick.",
            ),
            DemoValue(
                "I've started Japanese and do flashcards on the train each morning.",
                "Japanese, morning flashcards",
                "Spaced repetition works best when reviews are never skipped.",
            ),
            DemoValue(
                "I'm brushing up my Welsh so I can chat with my grandmother.",
                "Welsh, to chat with grandmother",
                "Short weekly calls in the language are a great motivator.",
            ),
        ),
    ),
    DemoKind(
        "podcast_taste",
        (
            DemoValue(
                "I listen to ancient history podcasts while I do the dishes.",
                "ancient history podcasts",
                "Series that run in order make long listening easier to follow.",
            ),
            DemoValue(
                "Comedy podcasts are what I put on during long drives.",
                "comedy podcasts on long drives",
                "Download episodes ahead so a weak signal never cuts them off.",
            ),
            DemoValue(
                "I follow three science podcasts and never miss a new episode.",
                "three science podcasts",
                "A queue in your player saves choosing each time.",
            ),
        ),
    ),
    DemoKind(
        "balcony_plants",
        (
            DemoValue(
                "I grow cherry tomatoes in pots on my balcony.",
                "cherry tomatoes in pots",
                "Tomatoes in pots need water daily once the fruit sets.",
            ),
            DemoValue(
                "My windowsill is full of basil, mint and chives.",
                "basil, mint and chives",
                "Pinching off flower buds keeps herbs leafy for longer.",
            ),
            DemoValue(
                "I keep a shelf of succulents that I water once a fortnight.",
                "succulents, watered fortnightly",
                "Let the soil dry out completely between waterings.",
            ),
        ),
    ),
    DemoKind(
        "collecting",
        (
            DemoValue(
                "I collect old postcards from seaside towns.",
                "old seaside postcards",
                "Acid-free sleeves keep old card from yellowing.",
            ),
            DemoValue(
                "I've been collecting vinyl jazz records since university.",
                "vinyl jazz records",
                "Storing records upright stops them from warping.",
            ),
            DemoValue(
                "I hunt for vintage fountain pens at flea markets.",
                "vintage fountain pens",
                "Flush a second-hand pen with water before the first fill.",
            ),
        ),
    ),
)

_SMALL_TALK = (
    ("Thanks, that was helpful!", "You're welcome, ask any time."),
    ("What's a good word for a very long list?", "You could call it an inventory."),
    ("Can you remind me what we talked about?", "We went over your question from earlier."),
)


@dataclass(frozen=True)
class WriteExample:
    """One excerpt and its exact edits: (label, value) pairs, in order."""

    memory: tuple[tuple[str, str], ...]
    excerpt: tuple[tuple[str, str], ...]  # (role, text)
    edits: tuple[tuple[str, str], ...]

    def render(self, number: int) -> str:
        memory = " ".join(f"[{k}] {v}" for k, v in self.memory) or "(empty)"
        excerpt = " ".join(f"{role}: {text}" for role, text in self.excerpt)
        edits = " ".join(f"[{k}] {v}" for k, v in self.edits) or "none"
        return f"{number}. Memory: {memory} | Excerpt: {excerpt} | Edits: {edits}"


def write_examples(n: int, seed: int = 0, *, style: str = "own_words") -> list[WriteExample]:
    """`n` (at most MAX_EXAMPLES) examples, one of each shape in order, drawn with `seed`.

    Shapes: a new fact beside the assistant's advice (the advice is not stored); an update
    under the label that holds the old value; two facts in one excerpt under two labels; an
    excerpt with no fact about the user (no edit). `style` is `own_words` (the value is the
    user's sentence) or `normalized` (a short phrase).
    """
    if style not in ("own_words", "normalized"):
        raise ValueError(f"style must be own_words or normalized; got {style!r}")
    if not 0 <= n <= MAX_EXAMPLES:
        raise ValueError(f"at most {MAX_EXAMPLES} examples; got {n}")
    rng = random.Random(seed)
    kinds = rng.sample(DEMO_KINDS, 4)

    def value(v: DemoValue) -> str:
        return v.said if style == "own_words" else v.short

    a, b, c, d = kinds
    va = rng.choice(a.values)
    old, new = rng.sample(b.values, 2)
    vc, vd = rng.choice(c.values), rng.choice(d.values)
    talk = rng.choice(_SMALL_TALK)
    shapes = [
        WriteExample((), (("user", va.said), ("assistant", va.advice)), ((a.label, value(va)),)),
        WriteExample(
            ((b.label, value(old)),),
            (("user", f"Something changed since we last talked. {new.said}"),),
            ((b.label, value(new)),),
        ),
        WriteExample(
            (),
            (("user", f"{vc.said} {vd.said}"), ("assistant", vc.advice)),
            ((c.label, value(vc)), (d.label, value(vd))),
        ),
        WriteExample(((a.label, value(va)),), (("user", talk[0]), ("assistant", talk[1])), ()),
    ]
    return shapes[:n]


def render_examples(examples: list[WriteExample]) -> str:
    if not examples:
        return ""
    return "\n".join([HEADER, *(e.render(i) for i, e in enumerate(examples, 1))])


def split_examples(text: str) -> tuple[str, int]:
    """(the instructions without their examples block, how many examples the block holds)."""
    head, sep, block = text.partition("\n\n" + HEADER)
    if not sep:
        return text, 0
    return head, sum(1 for line in block.splitlines() if line.strip())


def with_examples(text: str, n: int, seed: int = 0, *, style: str | None = None) -> str:
    """`text` with its examples block replaced by `n` examples (0: no block).

    The value style follows the instructions unless given: normalized when they ask for a
    short normalized value (the `normalized` edit operator's words), the user's own words
    otherwise.
    """
    head, _ = split_examples(text)
    if style is None:
        style = "normalized" if NORMALIZED_PHRASE in head else "own_words"
    block = render_examples(write_examples(n, seed, style=style))
    return f"{head}\n\n{block}" if block else head
