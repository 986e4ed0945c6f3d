"""Fakes and test doubles for memloop's tests and for users testing their own policies.

- :class:`FakeOpenAIServer`: a loopback OpenAI-compatible chat server with scripted replies;
- :class:`ScriptedMemoryLLM`: a reply function that tells the policies' requests apart;
- :class:`ScriptedPolicy`: a deterministic, model-free policy that passes ``check_policy``;
- :class:`ScriptedEvolver`: a deterministic, model-free evolver that passes ``check_evolver``;
- :func:`evolve_loop_reply`: a fake-server reply for the whole evolution loop (GEPA included);
- :func:`notes_checker`: a fake-server reply for the factual-recall check that reads the notes;
- :func:`gate_passes`: every gate decision says `improved` (tests of what follows a selection).

The conformance suites themselves live beside their Protocols:
:func:`memloop.environment.policy_check.check_policy` and
:func:`memloop.optimize.evolver_check.check_evolver`.
"""

from memloop.testing.checker import is_recall_request, notes_checker, recall_verdicts
from memloop.testing.evolvers import (
    ScriptedEvolver,
    awe_writing_reply,
    evolve_loop_reply,
    is_evolver_request,
    scripted_screen,
    writing_reply,
)
from memloop.testing.fake_server import (
    FakeOpenAIServer,
    fake_roles,
    request_schema,
    schema_valid_reply,
)
from memloop.testing.gate import gate_passes
from memloop.testing.policies import ScriptedPolicy, scripted_builder
from memloop.testing.scripted_llm import ScriptedMemoryLLM, conversation_of, request_kind

__all__ = [
    "scripted_screen",
    "FakeOpenAIServer",
    "ScriptedEvolver",
    "ScriptedMemoryLLM",
    "ScriptedPolicy",
    "conversation_of",
    "awe_writing_reply",
    "evolve_loop_reply",
    "writing_reply",
    "fake_roles",
    "gate_passes",
    "is_evolver_request",
    "is_recall_request",
    "notes_checker",
    "recall_verdicts",
    "request_kind",
    "request_schema",
    "schema_valid_reply",
    "scripted_builder",
]
