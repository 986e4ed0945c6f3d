"""GEPA over memory-write prompts: gepa's reflective, Pareto-based search.

Whole episodes are the rollouts. A candidate is {predictor name: instructions}; its score on a
user is the user's normalized memory score; its textual feedback is the user's feedback summary
in the configured mode. GEPA's state lives in the run folder (gepa_state/), so a restarted run
resumes the search; every evaluated episode is checkpointed, so nothing finished is redone.

Cycles for MLflow: cycle 0 = the seed prompts, cycle k = the best candidate (by GEPA's validation
score) after its k-th iteration, evaluated on the validation users (held-out users, or the
training users when there are none). The iteration history is kept in gepa_cycles.json because
a resumed search does not replay finished iterations.
"""

from __future__ import annotations

import json
import time
from typing import Any

from memloop.core.files import atomic_write_json, json_sha256
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import collect
from memloop.feedback.scoring import score
from memloop.optimize.evolution import Evolution, episode_summary, metric_row

GEPA_COMPONENT_NOTE = (
    "The assistant under test keeps a long-term memory of a user across many conversations. "
    "These instructions drive one memory-write step. Each example is one user's whole episode; "
    "the feedback lists questions the assistant answered from memory afterwards."
)


def candidate_id(candidate: dict[str, str]) -> str:
    return json_sha256(candidate)[:12]


def user_memory_score(records: list[QuestionRecord]) -> float:
    """GEPA needs a number: the memory score, or 0 where it is undefined (UB <= random)."""
    import warnings

    from memloop.feedback.scoring import MemoryScoreUndefined

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryScoreUndefined)
        value = score(records).memory_score
    return 0.0 if value is None else float(value)


class EpisodeAdapter:
    """gepa.GEPAAdapter: evaluate a candidate on a batch of users by running their episodes."""

    def __init__(self, evolution: Evolution):
        self.evo = evolution
        self.root = evolution.run_dir / "candidates"

    def evaluate(self, batch, candidate, capture_traces=False):
        from gepa.core.adapter import EvaluationBatch

        out = self.root / candidate_id(candidate)
        (out.parent).mkdir(parents=True, exist_ok=True)
        atomic_write_json(out.parent / f"{candidate_id(candidate)}.json", candidate)
        result = self.evo.evaluate(list(batch), candidate, out)
        scores, outputs, trajectories = [], [], []
        by_user = {e.user_id: e for e in result.episodes}
        for item in batch:
            records, _ = collect(by_user[item.id].records)
            value = user_memory_score(records)
            scores.append(value)
            outputs.append({"user": item.id, "memory_score": value})
            if capture_traces:
                mode = self.evo.mode
                summary = episode_summary(
                    [item],
                    records,
                    mode,
                    self.evo.config.summary_max_questions,
                    self.evo.config.environment.periods,
                )
                trajectories.append({"user": item.id, "score": value, "summary": summary})
        return EvaluationBatch(
            outputs=outputs, scores=scores, trajectories=trajectories if capture_traces else None
        )

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        rows = []
        for traj in eval_batch.trajectories or []:
            rows.append(
                {
                    "Inputs": {"task": GEPA_COMPONENT_NOTE, "user": traj["user"]},
                    "Generated Outputs": f"normalized memory score {traj['score']:.3f} "
                    "(1 = as good as knowing the user's true state)",
                    "Feedback": json.dumps(traj["summary"], ensure_ascii=False, indent=1)[:6000],
                }
            )
        return {name: rows for name in components_to_update}


def run_gepa(evo: Evolution, mlc, run_id: str) -> list[dict[str, Any]]:
    import gepa

    if not evo.initial_prompts:
        from memloop.core.errors import UserError

        raise UserError(
            f"policy {evo.policy_config.display_name} has no memory-write prompts "
            "for GEPA to evolve (use awi or awe)"
        )
    valset = evo.heldout or evo.train
    settings = evo.config.gepa
    budget = settings.max_metric_calls or (
        len(valset) + (evo.config.cycles - 1) * (2 * settings.minibatch_size + len(valset))
    )
    optimizer = evo.clients.optimizer.fork()

    def reflect(prompt: Any) -> str:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return optimizer.chat(messages, component="optimizer", max_tokens=1024).text

    state_dir = evo.run_dir / "gepa_state"
    state_dir.mkdir(parents=True, exist_ok=True)
    history_path = evo.run_dir / "gepa_cycles.json"
    history = json.loads(history_path.read_text()) if history_path.is_file() else []

    class RecordIterations:
        """Keeps, per finished iteration, the best candidate so far (a GEPA callback)."""

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
                }
            )
            atomic_write_json(history_path, history)

    result = gepa.optimize(
        seed_candidate=dict(evo.initial_prompts),
        trainset=list(evo.train),
        valset=list(valset),
        adapter=EpisodeAdapter(evo),
        reflection_lm=reflect,
        reflection_minibatch_size=min(settings.minibatch_size, len(evo.train)),
        candidate_selection_strategy="pareto",
        max_metric_calls=budget,
        run_dir=str(state_dir),
        seed=evo.config.seed,
        display_progress_bar=False,
        skip_perfect_score=False,
        raise_on_exception=True,
        callbacks=[RecordIterations()],
    )
    sequence = [(dict(evo.initial_prompts), result.val_aggregate_scores[0])] + [
        (h["candidate"], h["val_score"]) for h in history
    ]
    cycles = []
    for k, (candidate, val_score) in enumerate(sequence):
        started = time.perf_counter()
        held = evo.evaluate(valset, candidate, evo.run_dir / "candidates" / candidate_id(candidate))
        row = {
            "cycle": k,
            **metric_row(held.metrics),
            "per_user": held.metrics["per_user"],
            "gepa_val_score": val_score,
            "tokens": dict(held.metrics.get("usage", {})),
            "seconds": round(time.perf_counter() - started, 1),
        }
        if k == 0:
            row["tokens"]["optimizer"] = optimizer.usage.component("optimizer").total_tokens
        cdir = evo.run_dir / f"cycle_{k:02d}"
        cdir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cdir / "prompts.json", candidate)
        atomic_write_json(cdir / "done.json", row)
        evo.log_cycle(mlc, run_id, k, row, candidate, cdir)
        cycles.append(row)
    return cycles
