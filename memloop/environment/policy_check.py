"""``check_policy``: the conformance suite of the Policy contract, beside its Protocol.

In the spirit of Gymnasium's ``check_env``: it drives fresh policies through a tiny scripted
conversation and checks every promise of :class:`memloop.environment.policy.Policy` — every member
of the Protocol is present; probes never write memory; ``with_prompts`` returns a new policy, leaves
the original alone, starts fresh memory or (``keep_memory=True``) a copy of the original's, and
rejects unknown prompt names; save/load round-trips memory and prompts; replaying a conversation
with ``ingest`` remembers what holding it did; the same script gives the same memory and the same
probe answers twice (under a response cache for LLM-backed policies); ``close()`` twice is safe.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memloop.core.checks import CheckReport, ContractError
from memloop.core.errors import UserError
from memloop.environment.policy import Policy

DEFAULT_CONVERSATION = (
    "[Current Time: 2024-01-06 19:40:00]\nHi! I just moved to Lisbon for a new job and I want to "
    "find a running club.",
    "I run about 20 km a week, mostly in the evenings after work.",
    "[Current Time: 2024-04-03 20:15:00]\nQuick update: I moved again, I live in Oslo now.",
)
DEFAULT_PROBES = (
    "Which city do I live in?",
    "How much do I run each week?",
)
PROBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    # bounded: a model caught in a repetition loop ("Lisbon, Portugal, Europa, Europa, ...") is
    # closed inside valid JSON by a server that turns the schema into a grammar (llama.cpp)
    "properties": {"city": {"type": "string", "maxLength": 80}},
    "required": ["city"],
    "additionalProperties": False,
}


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The public members a Protocol declares: annotated attributes and methods, in order."""
    names = list(getattr(protocol, "__annotations__", {}))
    names += [
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and callable(value) and name not in names
    ]
    return tuple(names)


POLICY_MEMBERS = protocol_members(Policy)
UNKNOWN_PROMPT = "no_such_prompt_name"


def missing_members(cls: type) -> list[str]:
    """The Policy contract's methods a class lacks (its instances set `name` themselves).

    An `answer` that takes no `memory_only` keyword (the contract before scorer version 3) is
    named as `answer(memory_only=...)`: the state queries need it.
    """
    import inspect

    missing = [m for m in POLICY_MEMBERS if m != "name" and not callable(getattr(cls, m, None))]
    answer = getattr(cls, "answer", None)
    if callable(answer):
        try:
            params = inspect.signature(answer).parameters
        except (TypeError, ValueError):  # no signature to read (a builtin): let the call tell
            return missing
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if "memory_only" not in params and not takes_kwargs:
            missing.append("answer(memory_only=...)")
    return missing


class PolicyCheckError(ContractError):
    """One or more promises of the Policy contract are broken; the message lists them."""


@dataclass
class _Run:
    """One run of the suite: its report, its inputs, and what the checks so far found."""

    report: CheckReport
    fresh: Callable[[], Any]  # a new policy, closed at the end
    factory: Callable[[], Any]  # a new policy the suite does not close (close() is checked)
    tmp: Path
    conversation: Sequence[str]
    probes: Sequence[str]
    probe_rounds: int
    forbidden_strings: Sequence[str]
    opened: list[Any]
    first: Any = None  # the policy that holds the conversation
    empty_view: Any = None
    view: Any = None  # its memory after the conversation
    turns: list[tuple[str, Any]] = field(default_factory=list)
    first_answers: list[tuple[Any, ...]] = field(default_factory=list)
    prompts: Any = None

    def expect(self, condition: bool, check: str, problem: str) -> bool:
        return self.report.expect(condition, check, problem)


def _members(run: _Run) -> bool:
    """Every member of the Protocol, a name, a str memory view (nothing else without them)."""
    first = run.first
    missing = [attr for attr in POLICY_MEMBERS if not hasattr(first, attr)]
    if not run.expect(
        not missing,
        "has every member of the Policy contract",
        f"missing members: {', '.join(missing)}",
    ):
        return False
    run.expect(
        isinstance(first.name, str) and bool(first.name),
        "name is a non-empty str",
        f"name is {first.name!r}",
    )
    run.empty_view = first.memory_view()
    run.expect(
        isinstance(run.empty_view, str),
        "memory_view() returns str",
        f"memory_view() returned {type(run.empty_view).__name__}",
    )
    return True


def _holds_the_conversation(run: _Run) -> bool:
    """Each reply is a str (nothing else can be checked on a policy that does not reply)."""
    for message in run.conversation:
        reply = run.first.respond(message)
        if not run.expect(
            isinstance(reply, str),
            "respond() returns str",
            f"respond() returned {type(reply).__name__}",
        ):
            return False
        run.turns.append((message, reply))
    run.view = run.first.memory_view()
    return True


def _probes_never_write(run: _Run) -> bool:
    """Answers of the right shape; probes (state queries included) leave memory unchanged."""
    first = run.first
    for round_ in range(run.probe_rounds):
        for i, prompt in enumerate(run.probes):
            schema = PROBE_SCHEMA if (round_ + i) % 2 else None
            answer = first.answer(prompt, schema=schema)
            _check_answer(answer, schema, run.expect)
            if round_ == 0:
                run.first_answers.append(_answer_record(answer))
    # The state queries answer from written memory alone.
    answer = first.answer(run.probes[0], schema=PROBE_SCHEMA, memory_only=True)
    _check_answer(answer, PROBE_SCHEMA, run.expect)
    unwritten = first.unwritten_messages()
    run.expect(
        isinstance(unwritten, int) and not isinstance(unwritten, bool) and unwritten >= 0,
        "unwritten_messages() is an int >= 0",
        f"unwritten_messages() returned {unwritten!r:.60}",
    )
    run.expect(
        first.memory_view() == run.view,
        f"{run.probe_rounds * len(run.probes)} probes leave memory_view() unchanged",
        "a probe changed memory_view()",
    )
    return True


def _mutable_prompts(run: _Run) -> bool:
    """with_prompts gives a new policy and leaves the original; evolved prompts are saved.

    The new policy starts fresh memory (with keep_memory=True, a copy of the original's); an
    unknown prompt name is refused; evolved prompts survive save/load.
    """
    first, view, expect = run.first, run.view, run.expect
    prompts = run.prompts = first.prompts()
    if not expect(
        isinstance(prompts, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()),
        "prompts() is dict[str, str]",
        f"prompts() returned {prompts!r:.200}",
    ):
        return True
    changed = {k: v + "\nKeep every fact short." for k, v in prompts.items()}
    evolved = first.with_prompts(changed)
    run.opened.append(evolved)
    expect(
        evolved is not first, "with_prompts() returns a new object", "with_prompts() returned self"
    )
    expect(
        first.prompts() == prompts,
        "with_prompts() leaves the original's prompts",
        "with_prompts() changed the original policy's prompts",
    )
    expect(
        evolved.prompts() == changed,
        "the new policy uses the given prompts",
        "the policy from with_prompts() does not report the prompts it was given",
    )
    expect(
        first.memory_view() == view,
        "with_prompts() leaves the original's memory",
        "with_prompts() changed the original policy's memory",
    )
    expect(
        evolved.memory_view() == run.empty_view,
        "with_prompts() starts fresh memory",
        "the policy from with_prompts() does not start with empty memory",
    )
    _keeps_memory(run, changed)
    try:
        stray = first.with_prompts({UNKNOWN_PROMPT: "Remember everything."})
    except (UserError, ValueError, KeyError):
        rejected = True
    else:
        rejected = False
        run.opened.append(stray)
    expect(
        rejected,
        "with_prompts() rejects an unknown prompt name",
        f"with_prompts({{{UNKNOWN_PROMPT!r}: ...}}) was accepted (expected UserError, "
        "ValueError or KeyError)",
    )
    # Evolved prompts survive a checkpoint.
    evolved.save(run.tmp / "evolved")
    reloaded = run.fresh().load(run.tmp / "evolved")
    expect(
        reloaded.prompts() == changed,
        "save/load keeps evolved prompts",
        "prompts after load differ from the saved policy's prompts",
    )
    return True


def _keeps_memory(run: _Run, changed: dict[str, str]) -> None:
    """with_prompts(keep_memory=True): the original's memory, the new prompts, the original kept."""
    first, expect = run.first, run.expect
    try:
        kept = first.with_prompts(changed, keep_memory=True)
    except Exception as exc:
        expect(
            False,
            "with_prompts(keep_memory=True) works",
            f"with_prompts(keep_memory=True) raised {exc!r:.120}",
        )
        return
    run.opened.append(kept)
    expect(
        kept is not first and kept.memory_view() == run.view,
        "with_prompts(keep_memory=True) continues with the original's memory",
        "the policy from with_prompts(keep_memory=True) does not hold the original's memory",
    )
    expect(
        kept.prompts() == changed,
        "with_prompts(keep_memory=True) uses the given prompts",
        "the policy from with_prompts(keep_memory=True) does not report the prompts it was given",
    )
    expect(
        first.memory_view() == run.view and first.prompts() == run.prompts,
        "with_prompts(keep_memory=True) leaves the original unchanged",
        "with_prompts(keep_memory=True) changed the original policy",
    )


def _checkpoint_round_trip(run: _Run) -> bool:
    """save/load keeps memory and prompts, and the saved files hold no forbidden string."""
    expect = run.expect
    run.first.save(run.tmp / "held")
    restored = run.fresh()
    returned = restored.load(run.tmp / "held")
    expect(returned is restored, "load() returns self", "load() did not return self")
    expect(
        restored.memory_view() == run.view,
        "save/load round-trips memory_view()",
        "memory_view() after load differs from the saved policy's",
    )
    expect(
        restored.prompts() == run.prompts,
        "save/load round-trips prompts()",
        "prompts() after load differ from the saved policy's",
    )
    leaks = [
        (path.name, secret)
        for path in (run.tmp / "held").rglob("*")
        if path.is_file()
        for secret in run.forbidden_strings
        if secret and secret in path.read_text(encoding="utf-8", errors="ignore")
    ]
    expect(
        not leaks,
        "saved files hold none of the forbidden strings",
        f"saved file {leaks[0][0]} contains a forbidden string" if leaks else "",
    )
    return True


def _ingest_replays(run: _Run) -> bool:
    """Off-policy replay remembers what holding the conversation did."""
    replayed = run.fresh()
    for message, reply in run.turns:
        replayed.ingest(message, reply)
    run.expect(
        replayed.memory_view() == run.view,
        "ingest() of the held turns gives the same memory as respond()",
        "replaying the held turns with ingest() gives a different memory_view()",
    )
    return True


def _same_script_same_records(run: _Run) -> bool:
    """The same conversation gives the same memory and the same probe answers."""
    again = run.fresh()
    for message in run.conversation:
        again.respond(message)
    run.expect(
        again.memory_view() == run.view,
        "the same conversation gives the same memory",
        "a second run of the same conversation gives a different memory_view()",
    )
    again_answers = [
        _answer_record(again.answer(prompt, schema=PROBE_SCHEMA if i % 2 else None))
        for i, prompt in enumerate(run.probes)
    ]
    run.expect(
        again_answers == run.first_answers,
        "the same conversation and probes give the same answers",
        "a second run of the same conversation gives different probe answers",
    )
    return True


def _close_twice(run: _Run) -> bool:
    twice = run.factory()
    problem = ""
    try:
        twice.close()
        twice.close()
    except Exception as exc:
        problem = f"a second close() raised {exc!r:.120}"
    run.expect(not problem, "close() twice is safe", problem)
    return True


# The suite, in order: each check adds to one report; one returning False ends the run (what
# follows needs what it found missing).
CHECKS: tuple[Callable[[_Run], bool], ...] = (
    _members,
    _holds_the_conversation,
    _probes_never_write,
    _mutable_prompts,
    _checkpoint_round_trip,
    _ingest_replays,
    _same_script_same_records,
    _close_twice,
)


SECTIONS: dict[Callable[[_Run], bool], str] = {
    _members: "the contract's members",
    _holds_the_conversation: "a conversation",
    _probes_never_write: "answers and probes (memory unchanged)",
    _mutable_prompts: "memory-write prompts",
    _checkpoint_round_trip: "checkpoint and restore",
    _ingest_replays: "ingest (a replayed conversation)",
    _same_script_same_records: "the same script, the same records",
    _close_twice: "close",
}
"""Each check's heading in `memloop policy check`'s report."""


def check_policy(
    policy_factory: Callable[[], Any],
    *,
    conversation: Sequence[str] = DEFAULT_CONVERSATION,
    probes: Sequence[str] = DEFAULT_PROBES,
    probe_rounds: int = 5,
    forbidden_strings: Sequence[str] = (),
    workdir: Path | str | None = None,
    raise_on_problem: bool = True,
) -> CheckReport:
    """Check the policies ``policy_factory()`` builds, running ``CHECKS`` in order.

    Each call of ``policy_factory`` must return a fresh policy with empty memory.
    ``probe_rounds`` x ``probes`` answers are asked (half with a JSON schema);
    ``forbidden_strings`` (e.g. an API key) must not appear in any file ``save`` writes.

    Raises:
        PolicyCheckError: listing every problem, unless ``raise_on_problem`` is False.
    """
    opened: list[Any] = []

    def fresh() -> Any:
        policy = policy_factory()
        opened.append(policy)
        return policy

    first = fresh()
    report = CheckReport(name=str(getattr(first, "name", type(first).__name__)))
    with tempfile.TemporaryDirectory(prefix="check-policy-", dir=workdir) as tmp:
        run = _Run(
            report,
            fresh,
            policy_factory,
            Path(tmp),
            conversation,
            probes,
            probe_rounds,
            forbidden_strings,
            opened,
            first=first,
        )
        try:
            for check in CHECKS:
                report.section = SECTIONS[check]
                if not check(run):
                    break
        finally:
            for policy in opened:
                try:
                    policy.close()
                except Exception as exc:
                    report.problems.append(f"close() raised {type(exc).__name__}: {exc}")
    return _finish(report, raise_on_problem)


def _answer_record(answer: Any) -> tuple[Any, ...]:
    return (
        getattr(answer, "text", None),
        getattr(answer, "parsed", None),
        getattr(answer, "json_error", None),
        list(getattr(answer, "retrieved_memories", None) or []),
    )


def _check_answer(
    answer: Any, schema: dict[str, Any] | None, expect: Callable[[bool, str, str], bool]
) -> None:
    expect(
        isinstance(getattr(answer, "text", None), str),
        "answer().text is str",
        "answer() returned no text str",
    )
    memories = getattr(answer, "retrieved_memories", None)
    expect(
        isinstance(memories, list) and all(isinstance(m, str) for m in memories),
        "answer().retrieved_memories is list[str]",
        f"answer().retrieved_memories is {memories!r:.100}",
    )
    if schema is not None:
        parsed, error = getattr(answer, "parsed", None), getattr(answer, "json_error", None)
        expect(
            (parsed is None) != (error is None),
            "with a schema, answer() sets exactly one of parsed / json_error",
            f"with a schema, answer() gave parsed={parsed!r:.60} json_error={error!r:.60}",
        )


def _finish(report: CheckReport, raise_on_problem: bool) -> CheckReport:
    return report.finish(PolicyCheckError, "Policy", raise_on_problem)
