"""Which answer format lets the embedded model use the true state best (issue 16, item 6).

The upper bound of the multiple-choice probe is the model handed the user's true state; on the
1.5B model it was right 0.41 of the time (random 0.25), so the memory score cannot carry a signal.
This asks the same questions, each with its true state, in several answer formats and reports the
accuracy of each with a 95% interval, and the paired difference from the format memloop uses:

- `number` (memloop's): options numbered 1..n, JSON {"answer": <number>};
- `letter`: options lettered A..D, JSON {"answer": "<letter>"};
- `text`: JSON {"answer": "<the option's text>"} (an enum of the option texts);
- `reason_first`: JSON {"reason": "<one sentence>", "answer": <number>}: a short reason first.

Items: every (user, period, question) of a procedural environment (seed fixed here, before any
run), each question with the true values of its required variables. Cached: a rerun only
rebuilds the report.

    .venv/bin/python benchmarks/probe_formats.py --users 32 --out runs/bench/probe_formats
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED = 11  # fixed before the first run; not chosen on an outcome (12: the confirmation run)
LETTERS = "ABCDEFGH"

FORMATS: dict[str, dict[str, Any]] = {
    "number": {
        "label": lambda i: str(i + 1),
        "reply": 'Reply with a JSON object {"answer": <number of the best option>}.',
    },
    "letter": {
        "label": lambda i: LETTERS[i],
        "reply": 'Reply with a JSON object {"answer": "<letter of the best option>"}.',
    },
    "text": {
        "label": None,
        "reply": 'Reply with a JSON object {"answer": "<the best option, copied exactly>"}.',
    },
    "reason_first": {
        "label": lambda i: str(i + 1),
        "reply": 'Reply with a JSON object {"reason": "<one short sentence>", '
        '"answer": <number of the best option>}.',
    },
}


def schema(fmt: str, choices: list[str]) -> dict[str, Any]:
    n = len(choices)
    answer: dict[str, Any] = {
        "number": {"type": "integer", "enum": list(range(1, n + 1))},
        "letter": {"type": "string", "enum": list(LETTERS[:n])},
        "text": {"type": "string", "enum": choices},
        "reason_first": {"type": "integer", "enum": list(range(1, n + 1))},
    }[fmt]
    props: dict[str, Any] = {"answer": answer}
    if fmt == "reason_first":
        props = {"reason": {"type": "string", "maxLength": 200}, "answer": answer}
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def picked(fmt: str, parsed: Any, choices: list[str]) -> int | None:
    if not isinstance(parsed, dict):
        return None
    a = parsed.get("answer")
    if fmt in ("number", "reason_first") and isinstance(a, int) and 1 <= a <= len(choices):
        return a - 1
    if fmt == "letter" and isinstance(a, str) and a in LETTERS[: len(choices)]:
        return LETTERS.index(a)
    if fmt == "text" and a in choices:
        return choices.index(a)
    return None


def prompt(fmt: str, facts: str, question: str, choices: list[str]) -> str:
    """memloop's upper-bound prompt with the format's option labels and reply line."""
    from memloop.feedback.probes import UB_PROMPT

    body = UB_PROMPT.rsplit("\n\n", 1)[0]  # everything before the reply line
    spec = FORMATS[fmt]
    if spec["label"] is None:
        options = "\n".join(f"- {c}" for c in choices)
    else:
        options = "\n".join(f"{spec['label'](i)}. {c}" for i, c in enumerate(choices))
    return body.format(facts=facts, question=question, options=options) + "\n\n" + spec["reply"]


def main() -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.core.stats import Paired, t_interval
    from memloop.environment.procedural import generate_procedural
    from memloop.feedback.probes import UB_SYSTEM, words
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import load_endpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--periods", type=int, default=1, help="update periods (plus period 0)")
    parser.add_argument("--questions", type=int, default=1)
    parser.add_argument(
        "--endpoint", default=str(ROOT / "memloop/experiments/endpoints/local.yaml")
    )
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument(
        "--seed", type=int, default=SEED, help="environment seed (another seed: fresh items)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench/probe_formats")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    client = ChatClient(load_endpoint(args.endpoint), cache=args.out / "cache.sqlite")
    items = generate_procedural(
        users=args.users, periods=args.periods, questions=args.questions, seed=args.seed
    )
    cases = []
    for item in items:
        for period in range(args.periods + 1):
            for q, qa in enumerate(item.qas):
                values = item.required_state(q, period)
                facts = "\n".join(
                    f"- {words(v)}: {words(str(val))}"
                    for v, val in zip(qa.required_info, values, strict=True)
                )
                choices = [c.answer for c in qa.answer_choices]
                cases.append(
                    (
                        f"{item.id}/{period}/{q}",
                        facts,
                        qa.query,
                        choices,
                        item.gold_choice_index(q, period),
                    )
                )
    right: dict[str, dict[str, float]] = {f: {} for f in args.formats}
    unparsed = {f: 0 for f in args.formats}
    tokens = {f: 0 for f in args.formats}
    started = time.perf_counter()
    for fmt in args.formats:
        for key, facts, question, choices, gold in cases:
            reply = client.chat_json(
                [
                    {"role": "system", "content": UB_SYSTEM},
                    {"role": "user", "content": prompt(fmt, facts, question, choices)},
                ],
                schema(fmt, choices),
                component="probe",
            )
            choice = picked(fmt, reply.parsed, choices) if reply.ok else None
            unparsed[fmt] += choice is None
            tokens[fmt] += reply.prompt_tokens + reply.completion_tokens
            right[fmt][key] = float(choice == gold)
        print(f"{fmt}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    chance = sum(1 / len(c[3]) for c in cases) / len(cases)
    rows = []
    base = args.formats[0]
    for fmt in args.formats:
        values = list(right[fmt].values())
        ci = t_interval(values)
        paired = Paired.of(right[fmt], right[base])
        rows.append(
            {
                "format": fmt,
                "n": len(values),
                "accuracy": sum(values) / len(values),
                "ci95": ci,
                "unparsed": unparsed[fmt],
                "tokens": tokens[fmt],
                f"diff_vs_{base}": paired.mean,
                f"diff_ci95_vs_{base}": paired.t95,
                f"paired_vs_{base}": paired.to_dict(),
            }
        )
    report = {
        "endpoint": args.endpoint,
        "seed": args.seed,
        "items": len(cases),
        "chance": chance,
        "rows": rows,
        "note": "intervals: Student t over items (none when every value is equal); "
        "differences paired on items, with the sign-flip p and items up/tied/down",
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"{len(cases)} items (chance {chance:.3f}), endpoint {args.endpoint}")
    for r in rows:
        ci = r["ci95"]
        dci = r[f"diff_ci95_vs_{base}"]
        pair = r[f"paired_vs_{base}"]
        print(
            f"{r['format']:13s} accuracy {r['accuracy']:.3f} "
            + (f"[{ci[0]:.2f},{ci[1]:.2f}]" if ci else "(no interval)")
            + f"  unparsed {r['unparsed']:2d}  tokens {r['tokens']:6d}  "
            f"vs {base} {r[f'diff_vs_{base}']:+.3f}"
            + (f" [{dci[0]:+.2f},{dci[1]:+.2f}]" if dci else " (no interval)")
            + f" p={pair['sign_flip_p']:.3f} {pair['up']}/{pair['tied']}/{pair['down']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
