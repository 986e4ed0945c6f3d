"""The `gepa` search: gepa's reflective, Pareto-based search over memory-write prompts.

Whole episodes are the rollouts. A candidate is {predictor name: instructions}; its score on a
user is the user's value of the run's objective (memory score, state accuracy or memory gain);
its textual feedback is the user's budgeted feedback summary in the configured mode. GEPA learns
from the training users (its trainset) and chooses on the validation users (its valset); test
users are never shown to it.

Screening (`gepa.screen: replay`, the default): GEPA accepts a new candidate only if it beats its
parent on a training minibatch. The parent's minibatch runs on-policy (its episodes are the
reflection's feedback); the new candidate's is scored by replaying those recorded conversations
to it (optimize/replay_score.py: memory writes and state queries only), so both minibatch scores
are state accuracies, whatever the run's objective; validation scores stay on-policy, on it.
The search's own episodes and screens that no cycle shows count as `search_episodes` tokens.

GEPA's state lives in the run folder (gepa_state/), so a restarted run resumes the search; every
evaluated episode is checkpointed (candidates/<id>/episodes), so nothing finished is redone.

Cycles: cycle 0 = the seed prompts, cycle k = the best candidate (by GEPA's validation score)
after its k-th iteration, each evaluated on whole episodes of every split. The iteration history
is kept in gepa_cycles.json because a resumed search does not replay finished iterations.

Each cycle is yielded as soon as its iteration has finished: gepa.optimize is called once per
cycle with a stopper at that iteration, and each call resumes from gepa's saved state (the path
a restarted run takes; the seed's evaluation is read back from its checkpoints). A cycle counts
its own share of the search: its iteration's reflections (`optimizer`; cycle 0: none), the
episodes of losing candidates and of screens that no earlier cycle counted (`search_episodes`),
and the seconds its gepa call took. Summed over the cycles these are the whole search's.

Resuming gives the uninterrupted run's cycles and counts:
- gepa saves its state at the start of each iteration and reports the iteration's end from a
  `finally`, so an iteration stopped by Ctrl-C (or any error) is reported too and then run again
  on resume, under the same number. Only an iteration that finished is recorded, and the history
  is keyed by iteration number: a rerun iteration replaces its entry, never adds one.
- Each entry holds what its iteration counted (optimizer tokens, questions left out of the
  reflection feedback; entry 0: the seed's evaluation before the first iteration), and the
  cycles sum the entries, not the process's counters: a resumed process does not redo finished
  iterations, and a rerun one counts the same (an answer from the response cache counts the
  tokens it took when it was made).
- gepa draws parents and minibatches from one random.Random that it seeds per call and does not
  save; here that generator and the minibatch sampler's position are saved with gepa's state
  (the adapter-state hooks), so a resumed search draws what the uninterrupted one draws.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, json_sha256
from memloop.feedback.objective import Mode
from memloop.feedback.records import QuestionRecord, StateRead
from memloop.feedback.report import (
    collect,
    collect_reads,
    cost_by_component,
    usage_by_component,
)
from memloop.feedback.scoring import quiet_score
from memloop.feedback.summary import FeedbackSummary, render_summary
from memloop.llm.usage import add_costs
from memloop.optimize.contract import EvolveInput, EvolveStep, SearchContext, propose
from memloop.runs.cycles import CycleRecord

if TYPE_CHECKING:
    from memloop.environment.episode import PeriodRecord


class GepaSettings(BaseModel):
    """Settings of the GEPA search (`settings: {gepa: {...}}`; `gepa:` at the top works too)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "2" is not a number here

    minibatch_size: int = Field(2, ge=1, description="training users per reflective step")
    max_metric_calls: int | None = Field(
        None,
        ge=1,
        description="episode evaluations budget; default: enough for the configured cycles",
    )
    reflection_max_tokens: int = Field(
        1024, ge=16, description="cap of a reflection call (a proposal cut there is used as is)"
    )
    screen: Literal["replay", "none"] = Field(
        "replay",
        description="replay: a new candidate's training minibatch is scored by replaying its "
        "parent's recorded conversations (state accuracy; optimize/replay_score.py); none: by "
        "new on-policy episodes",
    )


class ReflectionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "2" is not a number here

    max_tokens: int = Field(1024, ge=16, description="cap of a reflection call")


class GepaReflection:
    """GEPA's proposal step as an evolver: gepa's own reflection prompt, one call per predictor.

    Each user of the input summary is one example of gepa's reflective dataset (its task note,
    the user's objective value as the output, and the user's feedback). The reply's text between
    ``` fences is the new instruction (gepa's extractor), taken as is.
    """

    name = "gepa"
    Settings = ReflectionSettings

    def __init__(self, client: Any, settings: ReflectionSettings | None = None):
        self.client = client
        self.settings = settings or ReflectionSettings()

    @staticmethod
    def examples(summary: FeedbackSummary) -> list[dict[str, Any]]:
        """Gepa's reflective dataset rows, one per user of `summary`."""
        rows = []
        for block in summary.users:
            feedback = {k: v for k, v in block.items() if k != "outcome"}
            rows.append(
                {
                    "Inputs": {"task": GEPA_COMPONENT_NOTE, "user": block.get("user")},
                    "Generated Outputs": block.get("outcome", ""),
                    "Feedback": render_summary(feedback),
                }
            )
        return rows

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        from gepa.strategies.instruction_proposal import InstructionProposalSignature

        spent = self.client.usage.mark("optimizer")
        rows = self.examples(inputs.summary)
        step = EvolveStep(prompts=dict(inputs.prompts))
        for name, text in sorted(inputs.prompts.items()):
            prompt = InstructionProposalSignature.prompt_renderer(
                {"current_instruction_doc": text, "dataset_with_feedback": rows}
            )
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            # capped: a small model copies the whole reflection prompt back, and pays for it
            reply = self.client.chat(
                messages, component="optimizer", max_tokens=self.settings.max_tokens
            ).text
            new = InstructionProposalSignature.output_extractor(reply.strip())["new_instruction"]
            step.prompts[name] = new
            step.changes[name] = ["gepa reflection"]
        step.tokens, step.cost_usd = spent.tokens(), spent.cost_usd()
        return step


GEPA_COMPONENT_NOTE = (
    "The assistant under test keeps a long-term memory of a user across many conversations. "
    "These instructions drive one memory-write step. Each example is one user's whole episode; "
    "the feedback lists questions the assistant answered from memory afterwards."
)
FEEDBACK_CHARS = 6000  # per user and reflection example


def candidate_id(candidate: dict[str, str]) -> str:
    return json_sha256(candidate)[:12]


def user_score(
    records: list[QuestionRecord],
    objective: str = "memory_score",
    reads: list[StateRead] | None = None,
) -> float:
    """GEPA needs a number per user: the user's `objective` (the run's selection objective).

    `reads`: the user's letter reads (state_prob needs them). Where the objective is undefined
    (the memory score when the upper bound never beats random for this user; the state accuracy
    without state queries; state_prob without log-probabilities) it is 0. That does not favour
    any candidate: definedness depends on the questions and the endpoint only, so the same users
    are undefined, and score the same 0, for every candidate.
    """
    scores = quiet_score(records, reads=reads)
    value = {
        "memory_score": scores.memory_score,
        "state_accuracy": scores.state.accuracy,
        "memory_gain": scores.memory_gain,
        "state_prob": scores.state.prob,
    }[objective]
    return 0.0 if value is None else float(value)


OBJECTIVE_TEXT = {
    "memory_score": "normalized memory score {:.3f} (1 = as good as knowing the user's true state)",
    "state_accuracy": "state accuracy {:.3f} (share of the user's current facts the assistant "
    "recalled right)",
    "memory_gain": "memory gain {:.3f} (accuracy with memory minus accuracy without it)",
    "state_prob": "state prob {:.3f} (the mean probability the memory read gave the user's "
    "current facts)",
}


def search_records(root: Path, cycle_candidates: set[str]) -> list[PeriodRecord]:
    """The period records of the search's episodes that no cycle's evaluation counts.

    A cycle's candidate is evaluated on every split in its own folder (its episodes are counted
    by the cycle): the rest are the other candidates' episodes and every replay screen.
    """
    from memloop.environment.episode import load_record

    uncounted = []
    for path in root.glob("*/**/record.json"):
        cid, part = path.relative_to(root).parts[:2]
        if cid not in cycle_candidates or part == "screen":
            uncounted.append(load_record(path))
    return uncounted


def load_history(path: Path) -> list[dict[str, Any]]:
    """gepa_cycles.json: one entry per finished iteration (0: before the first), by number.

    A file written before entries were keyed may hold an iteration twice (an interrupted one,
    then its rerun): the later entry stands.
    """
    if not path.is_file():
        return []
    by_iteration = {h["iteration"]: h for h in json.loads(path.read_text())}
    return [by_iteration[i] for i in sorted(by_iteration)]


def omitted_so_far(history: list[dict[str, Any]]) -> dict[int, int]:
    """Questions left out of the reflection feedback up to and including each iteration."""
    total, out = 0, {}
    for h in history:
        if "omitted_questions" in h:
            total += h["omitted_questions"]
        else:  # written before per-iteration counts: the running total as that process saw it
            total = h.get("feedback_omitted_questions", total)
        out[h["iteration"]] = total
    return out


class SearchDraws:
    """gepa's random draws (the parent of each iteration, the shuffled minibatches), resumable.

    gepa.optimize makes these from one random.Random(seed) per call and never saves it, so a
    resumed search would draw from the seed again. Here the candidate selector and batch sampler
    gepa would build are built on our generator, whose state and the sampler's position travel
    with gepa's saved state (`EpisodeAdapter.get_adapter_state`).
    """

    def __init__(self, seed: int, minibatch_size: int):
        from gepa.strategies.batch_sampler import EpochShuffledBatchSampler
        from gepa.strategies.candidate_selector import ParetoCandidateSelector

        self.rng = random.Random(seed)
        self.selector = ParetoCandidateSelector(rng=self.rng)
        self.sampler: Any = EpochShuffledBatchSampler(minibatch_size=minibatch_size, rng=self.rng)

    def state(self) -> dict[str, Any]:
        position = {k: v for k, v in vars(self.sampler).items() if k != "rng"}
        return {"rng": self.rng.getstate(), "sampler": copy.deepcopy(position)}

    def restore(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        for key, value in copy.deepcopy(state["sampler"]).items():
            setattr(self.sampler, key, value)


class FileLog:
    """gepa's log, to a file only: its lines (whole proposed prompts) are not for a terminal."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, message: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{message}\n")


class EpisodeAdapter:
    """gepa.GEPAAdapter: evaluate a candidate on a batch of users by running their episodes."""

    def __init__(
        self, ctx: SearchContext, screen: bool = False, proposer: GepaReflection | None = None
    ):
        self.ctx = ctx
        self.proposer = proposer  # makes every new candidate, through optimize.contract.propose
        self.iteration = 0  # gepa's current iteration (set by the iteration callback)
        self.feedback: FeedbackSummary | None = None  # the last reflective dataset's summary
        self.root = ctx.store.run_dir / "candidates"
        self.omitted = 0  # questions left out of reflection feedback by the size budget
        self.leaks_rejected = 0  # proposals the leak check refused (core/leaks.py)
        self.screen = screen  # screen new candidates on training users by replay
        self.train_ids = {item.id for item in ctx.users["train"]}
        self.recorded: dict[str, Path] = {}  # training user -> its latest on-policy episodes
        self.screen_next = False  # set by RecordIterations before a new candidate's minibatch
        self.draws: SearchDraws | None = None  # saved and restored with gepa's state

    # gepa's adapter-state hooks: called before each save of gepa's state and after a load
    # ({} for a new search, or a state saved before these hooks were used)
    def get_adapter_state(self) -> dict[str, Any]:
        return {"draws": self.draws.state()} if self.draws is not None else {}

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        if self.draws is not None and "draws" in state:
            self.draws.restore(state["draws"])

    def objective(self, user_id: str) -> str:
        """A training minibatch is scored on state accuracy when screening (a replay's measure)."""
        return "state_accuracy" if self.screen and user_id in self.train_ids else self.ctx.objective

    def evaluate(self, batch, candidate, capture_traces=False):
        from gepa.core.adapter import EvaluationBatch

        out = self.root / candidate_id(candidate)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out.parent / f"{candidate_id(candidate)}.json", candidate)
        result = self.ctx.evaluate(list(batch), candidate, out)
        scores, outputs, trajectories = [], [], []
        by_user = {e.user_id: e for e in result.episodes}
        for item in batch:
            self.recorded[item.id] = out / "episodes"
            records, _ = collect(by_user[item.id].records)
            reads = collect_reads(by_user[item.id].records)
            value = user_score(records, self.objective(item.id), reads)
            scores.append(value)
            outputs.append({"user": item.id, self.objective(item.id): value})
            if capture_traces:
                summary = self.ctx.summary(
                    [item], records, max_chars=FEEDBACK_CHARS, episodes=[by_user[item.id]]
                )
                self.omitted += len(summary.report.omitted) if summary.report else 0
                trajectories.append({"user": item.id, "score": value, "summary": summary})
        return EvaluationBatch(
            outputs=outputs, scores=scores, trajectories=trajectories if capture_traces else None
        )

    def batch_evaluate(self, items):
        """GEPA's minibatch evaluations: a parent's on-policy, a new candidate's by replay.

        GEPA evaluates a parent on a training minibatch (on-policy: its episodes are the
        reflection's feedback and become the recording), proposes a new candidate, and evaluates
        that on the same minibatch to decide whether it may go on to the validation users. With
        screening on, this second evaluation replays the parent's recorded conversations to the
        new candidate (optimize/replay_score.py) instead of holding new ones.
        """
        screen, self.screen_next = self.screen and self.screen_next, False
        return [
            self.replay(batch, candidate)
            if screen and all(i.id in self.train_ids and i.id in self.recorded for i in batch)
            else self.evaluate(batch, candidate, capture_traces=True)
            for candidate, batch in items
        ]

    def replay(self, batch, candidate):
        """State accuracy per user of `candidate` replayed on the users' latest recordings."""
        from gepa.core.adapter import EvaluationBatch

        cid = candidate_id(candidate)
        atomic_write_json(self.root / f"{cid}.json", candidate)
        by_user: dict[str, float | None] = {}
        for recording in sorted({self.recorded[item.id] for item in batch}):
            users = [item for item in batch if self.recorded[item.id] == recording]
            folder = json_sha256(str(recording.relative_to(self.root)))[:12]
            screening = self.ctx.replay_screen(
                users, candidate, recording, self.root / cid / "screen" / folder
            )
            by_user.update(screening.by_user)
        scores = [float(by_user[item.id] or 0.0) for item in batch]  # None: no state pair
        return EvaluationBatch(
            outputs=[
                {"user": item.id, "state_accuracy": value, "screen": "replay"}
                for item, value in zip(batch, scores, strict=True)
            ],
            scores=scores,
            trajectories=[
                {"user": item.id, "score": value, "summary": None, "screen": "replay"}
                for item, value in zip(batch, scores, strict=True)
            ],
        )

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        """The minibatch's feedback: one summary of its users, each with its objective value.

        Kept for `propose_new_texts`; gepa gets the same examples as rows (for its log).
        """
        parts = []
        for traj in eval_batch.trajectories or []:
            outcome = OBJECTIVE_TEXT[self.objective(traj["user"])].format(traj["score"])
            parts.append((traj["summary"], {"outcome": outcome}))
        self.feedback = FeedbackSummary.join(parts, mode=Mode(self.ctx.mode))
        rows = GepaReflection.examples(self.feedback)
        return {name: rows for name in components_to_update}

    def propose_new_texts(self, candidate, reflective_dataset, components_to_update):
        """Gepa's proposal hook: the GEPA evolver proposes through the optimizer contract."""
        assert self.proposer is not None and self.feedback is not None
        inputs = EvolveInput(
            prompts={name: candidate[name] for name in components_to_update},
            summary=self.feedback,
            cycle=self.iteration,
        )
        step = propose(self.proposer, inputs)
        self.leaks_rejected += step.leaks_rejected
        return step.prompts


class GepaSearch:
    name = "gepa"
    Settings = GepaSettings
    needs_val = True
    evolves_itself = True

    def __init__(self, settings: GepaSettings | None = None):
        self.settings = settings or GepaSettings()

    def cycles(self, ctx: SearchContext) -> Iterator[CycleRecord]:
        import gepa

        if not ctx.initial_prompts:
            raise UserError(
                f"policy {ctx.policy_name} has no memory-write prompts "
                "for GEPA to evolve (use awi or awe)"
            )
        train, valset = ctx.users["train"], ctx.users["val"]
        settings = self.settings
        minibatch = min(settings.minibatch_size, len(train))
        budget = settings.max_metric_calls or (
            len(valset) + (ctx.config.cycles - 1) * (2 * minibatch + len(valset))
        )
        optimizer = ctx.clients.optimizer.fork()
        proposer = GepaReflection(
            optimizer, ReflectionSettings(max_tokens=settings.reflection_max_tokens)
        )

        state_dir = ctx.store.run_dir / "gepa_state"
        state_dir.mkdir(parents=True, exist_ok=True)
        history_path = ctx.store.run_dir / "gepa_cycles.json"
        history = load_history(history_path)
        adapter = EpisodeAdapter(ctx, screen=settings.screen == "replay", proposer=proposer)
        adapter.draws = draws = SearchDraws(ctx.config.seed, minibatch)

        def counts() -> tuple[int, int, int, float]:
            used = optimizer.usage.component("optimizer")
            return used.total_tokens, adapter.omitted, adapter.leaks_rejected, used.cost_usd or 0.0

        def save_entry(iteration: int, since: tuple[int, int, int, float], **fields: Any) -> None:
            """Save iteration `iteration`'s entry with what it counted since `since`.

            It replaces any entry from an earlier attempt at it, and the later ones (gepa redoes
            them too).
            """
            tokens, omitted, leaks, dollars = counts()
            kept = [h for h in history if h["iteration"] < iteration]
            entry = {
                "iteration": iteration,
                **fields,
                "optimizer_tokens": tokens - since[0],
                "omitted_questions": omitted - since[1],
                "leaks_rejected": leaks - since[2],
            }
            if optimizer.endpoint.price_per_mtok is not None:
                entry["optimizer_cost_usd"] = dollars - since[3]
            entry["feedback_omitted_questions"] = omitted_so_far([*kept, entry])[iteration]
            history[:] = [*kept, entry]
            atomic_write_json(history_path, history)

        class RecordIterations:
            """GEPA callbacks: the history of finished iterations; screening's cue."""

            def __init__(self, new_search: bool) -> None:
                # a new search (no saved state): its seed evaluation is the one history counts
                self.new_search = new_search
                self.since = counts()  # the counters when the search or iteration started
                self.error: BaseException | None = None  # one being handled at that moment

            def on_valset_evaluated(self, event: Any) -> None:
                # the seed's evaluation, before gepa's first save: counted by a new search only
                # (a resumed one evaluates the seed again, from its checkpoints)
                if event["iteration"] == 0 and self.new_search:
                    save_entry(0, self.since)

            def on_iteration_start(self, event: Any) -> None:
                self.since, self.error = counts(), sys.exc_info()[1]
                adapter.iteration = event["iteration"]

            def on_iteration_end(self, event: Any) -> None:
                # gepa reports the end from a `finally`: an iteration that raised (Ctrl-C
                # included) is rerun on resume, under the same number, so it is not recorded
                if sys.exc_info()[1] is not self.error or interrupt.interrupted():
                    return
                state = event["state"]
                scores = state.program_full_scores_val_set
                best = max(range(len(scores)), key=lambda i: (scores[i], -i))
                save_entry(
                    event["iteration"],
                    self.since,
                    best=best,
                    candidate=dict(state.program_candidates[best]),
                    val_score=scores[best],
                    accepted=event["proposal_accepted"],
                )

            def on_evaluation_start(self, event: Any) -> None:
                # GEPA announces a new candidate's minibatch evaluation without an index
                if event["candidate_idx"] is None:
                    adapter.screen_next = True

        def entry(k: int) -> dict[str, Any] | None:
            return next((h for h in history if h["iteration"] == k), None)

        # duck-typed: gepa's generic protocols (GEPAAdapter, GEPACallback) cannot type these
        optimize: Any = gepa.optimize

        def search(iterations: int) -> tuple[float, float]:
            """Run gepa until `iterations` iterations have finished (or its budget has run out).

            Every call resumes from gepa's saved state (a first call starts it): the seed's
            evaluation is read back from its checkpoints and the draws from the adapter state.
            Returns the seed's validation score and the seconds the call took.
            """
            started = time.perf_counter()
            new_search = not (state_dir / "gepa_state.bin").is_file()

            def enough(state: Any) -> bool:
                return bool(state.i + 1 >= iterations)  # state.i + 1: iterations finished

            result = optimize(
                seed_candidate=dict(ctx.initial_prompts),
                trainset=list(train),
                valset=list(valset),
                adapter=adapter,  # its propose_new_texts makes the proposals (GepaReflection)
                # what "pareto" and reflection_minibatch_size would build, on resumable draws
                candidate_selection_strategy=draws.selector,
                batch_sampler=draws.sampler,
                max_metric_calls=budget,
                stop_callbacks=[enough],
                run_dir=str(state_dir),
                seed=ctx.config.seed,
                display_progress_bar=False,
                skip_perfect_score=False,
                raise_on_exception=True,
                callbacks=[RecordIterations(new_search)],
                logger=FileLog(state_dir / "run_log.txt"),
            )
            return result.val_aggregate_scores[0], time.perf_counter() - started

        done: list[CycleRecord] = []  # the cycles yielded so far
        counted: set[str] = set()  # their candidates: their folders' episodes are theirs
        seed_score = 0.0
        for k in itertools.count():
            record = ctx.store.record(k)
            if record is None:
                searched = 0.0  # seconds of the search's work for this cycle
                if k == 0:  # starts the search, or reads its seed's evaluation back
                    seed_score, searched = search(0)
                elif entry(k) is None:
                    _, searched = search(k)
                found = entry(k)
                if k > 0 and found is None:
                    return  # the search is over: its budget ran out (or gepa.stop was made)
                if k == 0:  # the seed: its entry (if any) holds no candidate of its own
                    proposed, val_score, leaks = dict(ctx.initial_prompts), seed_score, 0
                else:
                    assert found is not None
                    proposed, val_score = found["candidate"], found["val_score"]
                    leaks = found.get("leaks_rejected", 0)
                prompts = ctx.store.prompts(k, proposed)
                counted.add(candidate_id(prompts))
                record = self.cycle_record(ctx, k, prompts, val_score, leaks, history)
                record.seconds = round(record.seconds + searched, 1)
                count_search_work(record, found, search_records(adapter.root, counted), done)
                ctx.store.save(record)
            else:
                counted.add(candidate_id(ctx.store.saved_prompts(k) or {}))
            done.append(record)
            yield record

    @staticmethod
    def cycle_record(
        ctx: SearchContext,
        k: int,
        prompts: dict[str, str],
        val_score: float,
        leaks: int,
        history: list[dict[str, Any]],
    ) -> CycleRecord:
        """Cycle k's record: its prompts evaluated on whole episodes of every split."""
        began = time.perf_counter()
        results = ctx.evaluate_splits(
            prompts, ctx.store.run_dir / "candidates" / candidate_id(prompts)
        )
        return CycleRecord.of(
            k,
            results,
            seconds=time.perf_counter() - began,
            extra={
                "gepa_val_score": val_score,
                "feedback_omitted_questions": float(omitted_so_far(history).get(k, 0)),
            },
            leaks_rejected=leaks,
        )


def count_search_work(
    record: CycleRecord,
    found: dict[str, Any] | None,
    uncounted: list[PeriodRecord],
    done: list[CycleRecord],
) -> None:
    """Add this cycle's share of the search to `record`.

    Its iteration's reflections (`found`, its history entry: tokens and dollars), and the
    episodes of losing candidates and of screens (`uncounted`, all so far) that no cycle of
    `done` counted. A losing candidate never becomes a cycle's later (a cycle's candidate is the
    best so far, and scores do not change), so the shares add up to the search's whole work.
    """
    record.record_work(
        "optimizer",
        (found or {}).get("optimizer_tokens", 0),
        (found or {}).get("optimizer_cost_usd"),
    )
    before = add_costs(*(r.cost_usd.get("search_episodes") for r in done))
    dollars = add_costs(*cost_by_component(uncounted).values())
    record.record_work(
        "search_episodes",
        sum(usage_by_component(uncounted).values())
        - sum(r.tokens.get("search_episodes", 0) for r in done),
        None if dollars is None else dollars - (before or 0.0),
    )
