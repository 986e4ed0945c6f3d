"""The factual-recall checker measured on claims whose truth is known (`checker_calibration`).

Factual recall is only as good as the checker judging it: the embedded 0.5B model says "yes" to
claims a memory cannot hold, and a checker that says "yes" to everything scores every non-empty
memory 1.0. So every evaluation asks its checker, the way `Prober.recall` does (the same prompt,
schema and component "checker", through `Prober.recall` itself), about a few synthetic memory
documents built from the environment's own state schema, where the truth of each claim is known:

- *present*: the value the document holds for a variable (truth "yes");
- *contradicting*: a variable the document holds, with a different value (truth "no");
- *absent*: a variable the document does not mention (truth "no").

The documents are rendered as the policies' `memory_view()` renders memory: AWI's "Memory (label:
value):" lines (snake_case label, value in words) and the external (mem0) policy's "Stored memories
(n):" list, alternately. Everything is deterministic (sorted users and variables, no randomness),
so a rerun asks the same requests and the response cache answers them (no new call).

The false-positive rate (share of "yes" among truth-"no" claims) gates factual recall: above
MAX_FALSE_POSITIVE_RATE, or with no known-false claim judged, metrics.json reports `factual_recall`
as null with `factual_recall_null_reason` (`recall_null_reason`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from memloop.environment.data import Period, Session, UserItem
from memloop.feedback.probes import Prober, words
from memloop.llm.client import ChatClient
from memloop.llm.usage import UsageTracker

MAX_FALSE_POSITIVE_RATE = 0.10
"""Above this false-positive rate on known-false claims, factual recall is not reported."""

CALIBRATION_DOCUMENTS = 4  # synthetic memory documents (one checker request each)
CALIBRATION_CLAIMS = 6  # at most this many claims per document

Kind = Literal["present", "contradicting", "absent"]
KINDS: tuple[Kind, ...] = ("present", "contradicting", "absent")


@dataclass(frozen=True)
class CalibrationClaim:
    variable: str
    value: str  # the claimed value (a value of the variable in the state schema)
    kind: Kind

    @property
    def truth(self) -> bool:
        """Whether the document supports the claim."""
        return self.kind == "present"


@dataclass(frozen=True)
class CalibrationDocument:
    user_id: str  # the user whose state schema the document is built from
    facts: dict[str, str]  # {variable: value} the document holds
    claims: list[CalibrationClaim]
    style: Literal["awi", "external"]

    @property
    def text(self) -> str:
        """The document as the policy's memory_view() would render these facts."""
        if self.style == "awi":
            lines = [f"{v}: {words(value)}" for v, value in sorted(self.facts.items())]
            return "\n".join(["Memory (label: value):", *(lines or ["(empty)"])])
        texts = [f"The user's {words(v)} is {words(value)}." for v, value in self.facts.items()]
        return "\n".join([f"Stored memories ({len(texts)}):", *(f"- {t}" for t in texts)])


def calibration_documents(
    items: list[UserItem],
    documents: int = CALIBRATION_DOCUMENTS,
    claims: int = CALIBRATION_CLAIMS,
) -> list[CalibrationDocument]:
    """Up to `documents` documents with up to `claims` claims each, from the users' state schemas.

    The variables are those of every user's schema together (the first user in id order that
    has a variable gives its values), so an environment whose users each have few variables
    still gives full documents. Document d is attached to the d-th user in id order (cycling)
    and takes `claims` variables (sorted, starting at d x `claims`, wrapping around); they take
    the kinds present, contradicting, absent in turn (starting at kind d mod 3). A document holds
    its present and contradicting variables; every value is picked by position (no randomness).
    A variable with a single value cannot be contradicted: it is absent.
    """
    users = sorted((it for it in items if it.state_schema), key=lambda it: it.id)
    schema: dict[str, list[str]] = {}
    for it in users:
        for variable, values in it.state_schema.items():
            if values and variable not in schema:
                schema[variable] = list(values)
    all_names = sorted(schema)
    out: list[CalibrationDocument] = []
    for d in range(documents if all_names else 0):
        item = users[d % len(users)]
        start = (d * claims) % len(all_names)
        names = (all_names[start:] + all_names[:start])[: min(claims, len(all_names))]
        facts: dict[str, str] = {}
        made: list[CalibrationClaim] = []
        for i, variable in enumerate(names):
            values = schema[variable]
            kind = KINDS[(i + d) % len(KINDS)]
            held = values[(i + d) % len(values)]
            if kind == "contradicting" and len(values) < 2:
                kind = "absent"
            if kind == "absent":
                made.append(CalibrationClaim(variable, held, kind))
                continue
            facts[variable] = held
            claimed = (
                held if kind == "present" else values[((i + d) % len(values) + 1) % len(values)]
            )
            made.append(CalibrationClaim(variable, claimed, kind))
        out.append(CalibrationDocument(item.id, facts, made, "awi" if d % 2 == 0 else "external"))
    return out


@dataclass
class DocumentVerdicts:
    document: CalibrationDocument
    supported: dict[str, bool | None] = field(default_factory=dict)  # variable -> verdict
    json_error: str | None = None


def _claims_item(base: UserItem, doc: CalibrationDocument, index: int) -> UserItem:
    """A one-period user whose revealed states are exactly `doc`'s claims (for Prober.recall)."""
    claimed = {c.variable: c.value for c in doc.claims}
    period = Period(
        period_end=base.start_time,
        sessions=[Session(exposed_states=claimed, query="", session_time=base.start_time)],
        state=claimed,
        updates={},
    )
    return base.model_copy(update={"id": f"calibration-{index}:{base.id}", "periods": [period]})


def ask_checker(
    items: list[UserItem], documents: list[CalibrationDocument], checker: ChatClient
) -> list[DocumentVerdicts]:
    """The checker's verdict on every claim of `documents`, asked as `Prober.recall` asks."""
    by_id = {it.id: it for it in items}
    prober = Prober(ub_client=checker, checker_client=checker)

    def one(index: int, doc: CalibrationDocument) -> DocumentVerdicts:
        result = prober.recall(_claims_item(by_id[doc.user_id], doc, index), 0, doc.text)
        verdicts = {c.variable: c.supported for c in result.claims}
        return DocumentVerdicts(doc, verdicts, result.json_error)

    workers = max(1, min(len(documents), checker.endpoint.max_concurrency))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, range(len(documents)), documents))


def _rate(hits: int, n: int) -> float | None:
    return hits / n if n else None


def summarize(verdicts: list[DocumentVerdicts], model: str) -> dict[str, Any]:
    """The calibration result of `verdicts` (checker_calibration's dict, without `tokens`).

    Rates over the parsed verdicts: false positives among truth-"no" claims, false negatives among
    truth-"yes" claims; `unparsed` claims (the answer did not parse) count in neither.
    """
    by_kind = {k: {"n": 0, "yes": 0, "unparsed": 0} for k in KINDS}
    for dv in verdicts:
        for claim in dv.document.claims:
            verdict = dv.supported.get(claim.variable)
            row = by_kind[claim.kind]
            if verdict is None:
                row["unparsed"] += 1
            else:
                row["n"] += 1
                row["yes"] += int(verdict)
    negatives = [by_kind["contradicting"], by_kind["absent"]]
    n_negative = sum(r["n"] for r in negatives)
    n_positive = by_kind["present"]["n"]
    fp = _rate(sum(r["yes"] for r in negatives), n_negative)
    fn = _rate(n_positive - by_kind["present"]["yes"], n_positive)
    return {
        "model": model,
        "documents": len(verdicts),
        "false_positive_rate": fp,
        "n_negative": n_negative,
        "false_negative_rate": fn,
        "n_positive": n_positive,
        "unparsed": sum(r["unparsed"] for r in by_kind.values()),
        "by_kind": {
            k: {"n": r["n"], "yes_rate": _rate(r["yes"], r["n"]), "unparsed": r["unparsed"]}
            for k, r in by_kind.items()
        },
        "max_false_positive_rate": MAX_FALSE_POSITIVE_RATE,
        "passed": fp is not None and fp <= MAX_FALSE_POSITIVE_RATE,
    }


def checker_calibration(
    items: list[UserItem],
    checker: ChatClient | None,
    *,
    usage: UsageTracker | None = None,
    documents: int = CALIBRATION_DOCUMENTS,
    claims: int = CALIBRATION_CLAIMS,
) -> dict[str, Any] | None:
    """The checker's false-positive and false-negative rates on known-truth claims.

    None without a checker or without any state variable to build a document from. One request
    per document (cached like every request: a rerun sends none), counted in `usage` (component
    "checker"); `tokens` is their work (the same served from the cache, so reruns agree).
    """
    if checker is None:
        return None
    docs = calibration_documents(items, documents, claims)
    if not docs:
        return None
    tracker = usage or UsageTracker()
    verdicts = ask_checker(items, docs, checker.fork(tracker))
    result = summarize(verdicts, checker.endpoint.model)
    result["tokens"] = sum(tracker.tokens_by_component().values())
    return result


def recall_null_reason(calibration: dict[str, Any] | None) -> str | None:
    """Why factual recall is not reported under this calibration (None: it is reported).

    No calibration (no checker measured) reports recall as it is.
    """
    if calibration is None:
        return None
    fp = calibration.get("false_positive_rate")
    n = calibration.get("n_negative", 0)
    if fp is None:
        return (
            f"checker calibration: no answer on a known-false claim parsed "
            f"({calibration.get('unparsed', 0)} unparsed)"
        )
    limit = calibration.get("max_false_positive_rate", MAX_FALSE_POSITIVE_RATE)
    if fp > limit:
        return f"checker false-positive rate {fp:.2f} > {limit:.2f} on {n} known-false claims"
    return None
