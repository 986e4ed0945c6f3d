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
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, json_sha256
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import collect, usage_by_component
from memloop.feedback.scoring import quiet_score
from memloop.feedback.summary import render_summary
from memloop.optimize.cycles import CycleRecord

if TYPE_CHECKING:
    from memloop.optimize.config import EvolveConfig
    from memloop.optimize.context import RunContext

GEPA_COMPONENT_NOTE = (
    "The assistant under test keeps a long-term memory of a user across many conversations. "
    "These instructions drive one memory-write step. Each example is one user's whole episode; "
    "the feedback lists questions the assistant answered from memory afterwards."
)
FEEDBACK_CHARS = 6000  # per user and reflection example


def candidate_id(candidate: dict[str, str]) -> str:
    return json_sha256(candidate)[:12]


def user_score(records: list[QuestionRecord], objective: str = "memory_score") -> float:
    """GEPA needs a number per user: the user's `objective` (the run's selection objective).

    Where it is undefined (the memory score when the upper bound never beats random for this
    user; the state accuracy without state queries) it is 0. That does not favour any candidate:
    definedness depends on the questions and the endpoint only, so the same users are undefined,
    and score the same 0, for every candidate.
    """
    scores = quiet_score(records)
    value = {
        "memory_score": scores.memory_score,
        "state_accuracy": scores.state.accuracy,
        "memory_gain": scores.memory_gain,
    }[objective]
    return 0.0 if value is None else float(value)


OBJECTIVE_TEXT = {
    "memory_score": "normalized memory score {:.3f} (1 = as good as knowing the user's true state)",
    "state_accuracy": "state accuracy {:.3f} (share of the user's current facts the assistant "
    "recalled right)",
    "memory_gain": "memory gain {:.3f} (accuracy with memory minus accuracy without it)",
}


def search_tokens(root: Path, cycle_candidates: set[str]) -> int:
    """Model tokens of the search's episodes that no cycle's evaluation counts.

    A cycle's candidate is evaluated on every split in its own folder (its episodes are counted
    by the cycle): the rest are the other candidates' episodes and every replay screen.
    """
    from memloop.environment.episode import load_record

    uncounted = []
    for path in root.glob("*/**/record.json"):
        cid, part = path.relative_to(root).parts[:2]
        if cid not in cycle_candidates or part == "screen":
            uncounted.append(load_record(path))
    return sum(usage_by_component(uncounted).values())


class FileLog:
    """gepa's log, to a file only: its lines (whole proposed prompts) are not for a terminal."""

    def __init__(self, path: Path):
        self.path = path

    def log(self, message: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{message}\n")


class EpisodeAdapter:
    """gepa.GEPAAdapter: evaluate a candidate on a batch of users by running their episodes."""

    # GEPAAdapter's optional hook, read as an attribute: without it gepa 0.1.4's proposer fails
    # on every iteration and proposes nothing (the reflection LM then writes the new texts)
    propose_new_texts = None

    def __init__(self, ctx: RunContext, screen: bool = False):
        self.ctx = ctx
        self.root = ctx.run_dir / "candidates"
        self.omitted = 0  # questions left out of reflection feedback by the size budget
        self.screen = screen  # screen new candidates on training users by replay
        self.train_ids = {item.id for item in ctx.train}
        self.recorded: dict[str, Path] = {}  # training user -> its latest on-policy episodes
        self.screen_next = False  # set by RecordIterations before a new candidate's minibatch

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
            value = user_score(records, self.objective(item.id))
            scores.append(value)
            outputs.append({"user": item.id, self.objective(item.id): value})
            if capture_traces:
                summary, report = self.ctx.summary([item], records, max_chars=FEEDBACK_CHARS)
                self.omitted += len(report.omitted)
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

        from memloop.optimize.replay_score import replay_screen

        cid = candidate_id(candidate)
        atomic_write_json(self.root / f"{cid}.json", candidate)
        by_user: dict[str, float | None] = {}
        for recording in sorted({self.recorded[item.id] for item in batch}):
            users = [item for item in batch if self.recorded[item.id] == recording]
            screening = replay_screen(
                users,
                self.ctx.factory(candidate),
                self.ctx.clients.agent,
                recording,
                self.root
                / cid
                / "screen"
                / json_sha256(str(recording.relative_to(self.root)))[:12],
                periods=self.ctx.config.environment.periods,
                parallel_users=self.ctx.config.parallel_users,
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
        rows = [
            {
                "Inputs": {"task": GEPA_COMPONENT_NOTE, "user": traj["user"]},
                "Generated Outputs": OBJECTIVE_TEXT[self.objective(traj["user"])].format(
                    traj["score"]
                ),
                "Feedback": render_summary(traj["summary"]),
            }
            for traj in eval_batch.trajectories or []
        ]
        return {name: rows for name in components_to_update}


class GepaSearch:
    name = "gepa"
    needs_val = True
    evolves_itself = True

    def spec(self, config: EvolveConfig) -> dict[str, Any]:
        return {"name": self.name, **config.gepa.model_dump()}

    def cycles(self, ctx: RunContext) -> Iterator[CycleRecord]:
        import gepa

        if not ctx.initial_prompts:
            raise UserError(
                f"policy {ctx.policy_config.display_name} has no memory-write prompts "
                "for GEPA to evolve (use awi or awe)"
            )
        from memloop.optimize.context import split_results, usage_tokens

        train, valset = ctx.users["train"], ctx.users["val"]
        settings = ctx.config.gepa
        minibatch = min(settings.minibatch_size, len(train))
        budget = settings.max_metric_calls or (
            len(valset) + (ctx.config.cycles - 1) * (2 * minibatch + len(valset))
        )
        optimizer = ctx.clients.optimizer.fork()

        def reflect(prompt: Any) -> str:
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            # capped (gepa.reflection_max_tokens): a small model copies the whole reflection
            # prompt back, and pays for every token of it
            return optimizer.chat(
                messages, component="optimizer", max_tokens=settings.reflection_max_tokens
            ).text

        state_dir = ctx.run_dir / "gepa_state"
        state_dir.mkdir(parents=True, exist_ok=True)
        history_path = ctx.run_dir / "gepa_cycles.json"
        history = json.loads(history_path.read_text()) if history_path.is_file() else []
        adapter = EpisodeAdapter(ctx, screen=settings.screen == "replay")

        class RecordIterations:
            """GEPA callbacks: the best candidate after each iteration; screening's cue."""

            def on_iteration_end(self, event: Any) -> None:
                state = event["state"]
                scores = state.program_full_scores_val_set
                best = max(range(len(scores)), key=lambda i: (scores[i], -i))
                history.append(
                    {
                        "iteration": event["iteration"],
                        "best": best,
                        "candidate": dict(state.program_candidates[best]),
                        "val_score": scores[best],
                        "accepted": event["proposal_accepted"],
                        "feedback_omitted_questions": adapter.omitted,
                    }
                )
                atomic_write_json(history_path, history)

            def on_evaluation_start(self, event: Any) -> None:
                # GEPA announces a new candidate's minibatch evaluation without an index
                if event["candidate_idx"] is None:
                    adapter.screen_next = True

        started = time.perf_counter()
        result = gepa.optimize(
            seed_candidate=dict(ctx.initial_prompts),
            trainset=list(train),
            valset=list(valset),
            adapter=adapter,
            reflection_lm=reflect,
            reflection_minibatch_size=minibatch,
            candidate_selection_strategy="pareto",
            max_metric_calls=budget,
            run_dir=str(state_dir),
            seed=ctx.config.seed,
            display_progress_bar=False,
            skip_perfect_score=False,
            raise_on_exception=True,
            callbacks=[RecordIterations()],
            logger=FileLog(state_dir / "run_log.txt"),
        )
        search_seconds = round(time.perf_counter() - started, 1)
        sequence = [(dict(ctx.initial_prompts), result.val_aggregate_scores[0], 0)] + [
            (h["candidate"], h["val_score"], h.get("feedback_omitted_questions", 0))
            for h in history
        ]
        for k, (candidate, val_score, omitted) in enumerate(sequence):
            prompts = ctx.store.prompts(k, candidate)
            record = ctx.store.record(k)
            if record is None:
                began = time.perf_counter()
                results = ctx.evaluate_splits(
                    prompts, ctx.run_dir / "candidates" / candidate_id(prompts)
                )
                record = CycleRecord(
                    cycle=k,
                    splits=split_results(results),
                    tokens=usage_tokens(results.values()),
                    seconds=round(time.perf_counter() - began, 1),
                    extra={
                        "gepa_val_score": val_score,
                        "feedback_omitted_questions": float(omitted),
                    },
                )
                if k == 0:  # the search's own work, counted once
                    record.tokens["optimizer"] = optimizer.usage.component("optimizer").total_tokens
                    record.tokens["search_episodes"] = search_tokens(
                        adapter.root, {candidate_id(c) for c, _, _ in sequence}
                    )
                    record.seconds += search_seconds
                ctx.store.save(record)
            yield record
