"""The mutable memory-write prompts as DSPy programs.

Each prompt is the instructions of one named predictor. Replacing a prompt builds a new signature
(`with_instructions`), never mutating a signature class that other programs share. Programs are
saved in DSPy's JSON format; they hold no LM, so no endpoint URL or key can reach the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dspy
import pydantic

from memloop.core.errors import UserError
from memloop.core.settings import quiet_logger
from memloop.llm.client import ChatClient
from memloop.llm.dspy_lm import make_dspy_lm

# -- AWI: the in-context memory writer --------------------------------------------------------

AWI_WRITER_INSTRUCTIONS = """\
You keep the long-term memory of a personal assistant: a small set of labelled facts about its \
user. Read the conversation excerpt and return the edits that bring the memory up to date.
- Keep facts about the user that will matter for personalised advice later: where and how they \
live, work, study and travel, family and relationships, health, routines, habits and how much or \
how often they do things, finances, preferences, goals, plans and constraints.
- A label is a short snake_case name for the kind of fact and the value states it, as in the \
label home_city with the value <the city>. Reuse the existing label when the excerpt is about \
the same thing; the value you give replaces the old value completely, so write the full current \
value.
- When the user says something changed, overwrite the old value with the new situation. Do not \
keep the old value under another label.
- Give value null to delete a label that is no longer true and has no replacement.
- Only record what the user states or clearly implies about themselves; skip the assistant's \
suggestions, small talk and general knowledge. A "[Current Time: ...]" stamp says when a message \
was sent; it is not a fact about the user.
- Return an empty list of edits when nothing needs to change."""


# The example label is kept on purpose, though the embedded 1.5B model echoes it ("home_city: New
# York" in every user's memory, issue 16): without it the 0.5B model stopped following a change of
# city, and a rewrite telling the writer to skip the user's questions made it store its own answer
# to one. AWI's grounding check (policies/awi.py::grounded) drops any value the user never gave.


class MemoryEdit(pydantic.BaseModel):
    label: str = pydantic.Field(description="snake_case name of the fact")
    value: str | None = pydantic.Field(description="the full new value, or null to delete")


class WriteInContextMemory(dspy.Signature):
    """Instructions are set from AWI_WRITER_INSTRUCTIONS."""

    memory: str = dspy.InputField(desc="the current memory as a JSON object {label: value}")
    conversation: str = dspy.InputField(desc="the newest messages not yet in memory")
    edits: list[MemoryEdit] = dspy.OutputField(desc="labels to set or (value null) delete")


class AWIProgram(dspy.Module):
    """Predictor `writer`: conversation excerpt + current memory -> memory edits."""

    def __init__(self, writer: str = AWI_WRITER_INSTRUCTIONS):
        super().__init__()
        self.writer = dspy.Predict(WriteInContextMemory.with_instructions(writer))

    def forward(self, memory: str, conversation: str) -> dspy.Prediction:
        return self.writer(memory=memory, conversation=conversation)


# -- AWE: mem0's extraction and reconciliation prompts ----------------------------------------

AWE_FACT_EXTRACTION_INSTRUCTIONS = """\
You pick out lasting facts about the user from a conversation between the user and an assistant; \
they go into a long-term memory used to personalise later answers.
Write each fact as one short sentence about the user that makes sense on its own and leaves \
out "the user" (for example "Lives in <city>" or "Works as a <job>"). Cover where and how they \
live, work and study, family, health, routines, amounts and frequencies, money, preferences, \
goals and plans. When the user reports a change, write the new situation as it is now (for \
example "Now lives in <new city>, no longer in <old city>"). Only write what the user said or \
clearly implied; leave out the assistant's advice, small talk, general knowledge and the \
"[Current Time: ...]" stamps of the messages.
Answer with JSON of the form {"facts": ["...", "..."]}; use an empty list when there is nothing \
worth keeping."""

AWE_MEMORY_UPDATE_INSTRUCTIONS = """\
You keep a user's long-term memory correct and free of contradictions. Compare every new fact \
with the existing memories and choose one event for each:
- ADD a fact that is not in memory yet (its id is "new").
- UPDATE an existing memory (keep its id, write the complete new text) when the new fact adds \
detail to it or replaces it because the user's situation has changed.
- DELETE an existing memory that the new facts show is no longer true and that no new fact \
replaces.
- NONE when the fact is already recorded.
Two memories must never contradict each other: the new fact wins over the old one."""


class ExtractFacts(dspy.Signature):
    """Instructions are set from AWE_FACT_EXTRACTION_INSTRUCTIONS."""

    conversation: str = dspy.InputField()
    facts: list[str] = dspy.OutputField()


class ReconcileMemories(dspy.Signature):
    """Instructions are set from AWE_MEMORY_UPDATE_INSTRUCTIONS."""

    existing_memories: str = dspy.InputField()
    new_facts: list[str] = dspy.InputField()
    memory: str = dspy.OutputField(desc="JSON list of {id, text, event, old_memory}")


class AWEProgram(dspy.Module):
    """Predictors `fact_extraction` and `memory_update`.

    mem0 formats and sends these prompts itself (as custom_fact_extraction_prompt /
    custom_update_memory_prompt); the program is the container the optimizer edits, the file a
    checkpoint stores, and, exported, a DSPy program that runs both steps (`forward`).
    """

    def __init__(
        self,
        fact_extraction: str = AWE_FACT_EXTRACTION_INSTRUCTIONS,
        memory_update: str = AWE_MEMORY_UPDATE_INSTRUCTIONS,
    ):
        super().__init__()
        self.fact_extraction = dspy.Predict(ExtractFacts.with_instructions(fact_extraction))
        self.memory_update = dspy.Predict(ReconcileMemories.with_instructions(memory_update))

    def forward(self, conversation: str, existing_memories: str = "[]") -> dspy.Prediction:
        """mem0's two steps as DSPy runs them: extract, then reconcile.

        The facts of `conversation`, then the memory events that reconcile them with
        `existing_memories` (JSON list of {id, text}). Inside memloop mem0 sends these prompts
        itself; this makes the exported program run on its own (`dspy.load`).
        """
        facts = self.fact_extraction(conversation=conversation).facts
        update = self.memory_update(existing_memories=existing_memories, new_facts=facts)
        return dspy.Prediction(facts=facts, memory=update.memory)


# -- helpers ----------------------------------------------------------------------------------


def program_prompts(program: dspy.Module) -> dict[str, str]:
    return {name: pred.signature.instructions for name, pred in program.named_predictors()}


def save_program(program: dspy.Module, path: Path) -> None:
    """DSPy's JSON state; written through a temp file so a crash never leaves half a file."""
    tmp = path.with_name(f".{path.name}.tmp.json")
    program.save(str(tmp))
    tmp.replace(path)


def save_whole_program(program: dspy.Module, folder: Path) -> None:
    """The program with its class (DSPy's `save_program=True`), for `dspy.load(folder)`.

    Written to a temporary folder renamed into place; an earlier one is replaced.
    """
    import shutil

    # DSPy wants a folder name without a suffix: no dot after the leading one
    tmp = folder.with_name(f".{folder.name.replace('.', '_')}_tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # DSPy warns on save that loading pickles is unsafe: memloop writes them, the user's
    # `dspy.load(..., allow_pickle=True)` says it; no library line on memloop's output
    with quiet_logger("dspy.primitives.base_module"):
        program.save(str(tmp), save_program=True)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)


def load_program(program: dspy.Module, path: Path) -> None:
    if not path.is_file():
        raise UserError(f"{path}: no such file (not a policy checkpoint folder?)")
    try:
        program.load(str(path))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a saved program of this policy ({exc})") from None


def structured_lm(client: ChatClient, component: str = "memory") -> Any:
    """A dspy.LM over `client` whose engine declares JSON-schema support.

    With it, the JSONAdapter sends the signature's output schema and the endpoint constrains the
    answer to it.
    """
    lm = make_dspy_lm(client, component)
    # ChatClientEngine declares no capabilities, and DSPy then sends no response_format at all.
    lm.engine.supports_response_schema = True
    lm.engine.supported_params = frozenset({"temperature", "max_tokens", "stop", "response_format"})
    return lm


def unwrap_user_error(exc: BaseException) -> BaseException | None:
    """The memloop UserError (endpoint down, key rejected) that DSPy wrapped, if any."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, UserError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None
