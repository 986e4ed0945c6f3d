"""Import a run of the published AMemGym evaluation scripts as memloop records and metrics.

The published scripts (github.com/AGI-Eval-Official/amemgym, `src/amemgym/eval/`) write one
folder per user under `<output_dir>/<agent name>/`:

- `overall_results.json` (eval/overall.py): `[period][question]` rows with `query`, `answer` (the
  gold option, 0-based), `answer_state`, `answer_choice`, `raw_response`, `response` (the pick,
  1-based), `response_state`, `response_choice`, `json_error`, `scores.accuracy`;
- `diagnosis_results.json` (eval/diagnosis.py, optional): `[period][question]` state queries with
  the sub-schema in `query` and per required variable `info_type`, `json_error`, `answer_state`
  (the truth), `response_state`, `write_pos`, `read_pos`.

The upper bound (eval/upperbound.py) is a separate folder `<output_dir>/<llm model>/` whose
`utilization_results.json` is `[item][question][option]`: the bare LLM handed each option's state.
It is the only published file that lists every answer option, so the options, the random baseline
and the memory score come from it.

Each (user, period, question) becomes a faithful :class:`QuestionRecord`; memloop's own scorer
(`report.build_metrics`) computes every metric. Where the two definitions differ: an answer the
published code could not parse got a random option (scored right 1/#options of the time); here it
is unparsed (`chosen_index` None), so never right and a `format` failure. The same holds for a
pick of 0 or below, which the published code wraps to the last options. The upper bound is taken
per question (the published metrics file looks it up by state tuple only, so two questions with
the same values can swap scores). Fields no published file has stay None or empty: see
`NOT_IMPORTED`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any, NoReturn

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, atomic_write_text, refuse_foreign_file
from memloop.environment.episode import PeriodRecord
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import build_metrics

OVERALL_FILE = "overall_results.json"
DIAGNOSIS_FILE = "diagnosis_results.json"
UB_FILE = "utilization_results.json"
RECORDS_FILE = "records.jsonl"  # what an import writes in its --out folder
METRICS_FILE = "metrics.json"
FORMAT = "amemgym"
# a user folder of a published run holds some of these
_USER_MARKERS = (
    OVERALL_FILE,
    "overall_metrics.json",
    DIAGNOSIS_FILE,
    "agent_config.json",
    "interactions",
    "agent_states",
)
# stands in for the unknown options while scoring a run without its upper bound; never written
_UNKNOWN_OPTION = "(options unknown: the published overall files do not list them)"

NOT_IMPORTED = [
    "no_memory, memory_gain: AMemGym has no no-memory control (nm_chosen_index stays None)",
    "factual_recall: the published code has no factual-recall check",
    "retrieved_memories: overall_results.json does not save them",
    "usage: the published files count the tokens of the questions only, not of the "
    "conversations (left empty rather than half counted)",
    "agent_config.json: not read (the published code saves the resolved API key in it)",
]
NOT_IMPORTED_WITHOUT_UB = (
    "choices, random, upper_bound, memory_score: only the upper-bound run "
    "(utilization_results.json, --upper-bound) lists every answer option"
)
NOT_IMPORTED_WITHOUT_DIAGNOSIS = (
    "required_info, true_values, write_periods, state_answers, state accuracy and the "
    "write/read/utilization shares: the run has no diagnosis_results.json"
)


def _fail(path: Path, message: str) -> NoReturn:
    raise UserError(f"{path}: {message}")


def _show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_json(path: Path, what: str) -> Any:
    if not path.is_file():
        _fail(path, f"missing ({what})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(path, f"cannot read it ({exc})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")


@dataclass
class _Row:
    """One published record, its location for messages."""

    path: Path
    where: str  # "period 1 question 0: "
    data: dict[str, Any]

    def get(self, key: str, kind: str) -> Any:
        """The value of `key`, checked to be of `kind` (a key of `_KINDS`)."""
        if key not in self.data:
            _fail(self.path, f"{self.where}missing key '{key}'")
        value = self.data[key]
        check, description = _KINDS[kind]
        if not check(value):
            _fail(self.path, f"{self.where}'{key}' should be {description} (got {_show(value)})")
        return int(value) if kind == "pick" else value


_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    # a pick of JSON true/false was used as 1/0 by the published code, as Python does
    "pick": (lambda v: isinstance(v, int), "an integer"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str list": (
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "a list of strings",
    ),
    "list": (lambda v: isinstance(v, list), "a list"),
    "any": (lambda v: True, "anything"),
}


def _published_row(path: Path, where: str, value: Any) -> _Row:
    """One published record: a JSON object (None: the published run did not finish it)."""
    if value is None:
        _fail(path, f"{where}no result (the published run did not finish it)")
    if not isinstance(value, dict):
        _fail(path, f"{where}expected a JSON object (got {_show(value)})")
    return _Row(path, where, value)


def _grid(path: Path, data: Any) -> list[list[_Row]]:
    """A `[period][question]` list of records, complete and rectangular."""
    if not isinstance(data, list) or not data:
        _fail(path, "expected a non-empty list of periods, each a list of records per question")
    rows: list[list[_Row]] = []
    for i, row in enumerate(data):
        if not isinstance(row, list) or not row:
            _fail(path, f"period {i}: expected a non-empty list of records per question")
        out = []
        for q, rec in enumerate(row):
            out.append(_published_row(path, f"period {i} question {q}: ", rec))
        if len(out) != len(rows[0] if rows else out):
            _fail(path, f"period {i} has {len(out)} questions, period 0 {len(rows[0])}")
        rows.append(out)
    return rows


# ---------------------------------------------------------------- the multiple-choice answers


@dataclass
class _Answer:
    query: str
    gold: int  # 0-based
    gold_state: list[str]
    gold_text: str
    raw: str
    response: int  # 1-based, as published (random when json_error, may be <= 0)
    response_text: str
    json_error: bool
    published_accuracy: float


def _pick(
    response: int, json_error: bool, n: int | None, what: str
) -> tuple[int | None, str | None]:
    """(0-based pick, error) in memloop's terms: unparsed and out-of-range picks are None."""
    if json_error:
        return None, (
            f"{what} did not parse (published json_error; the published code scored random "
            f"option {response} instead)"
        )
    if response < 1:
        wrapped = f" = option {n + response}" if n is not None else ""
        return None, (
            f"{what} was out of range: {response} (the published code took it from the end of the "
            f"list{wrapped})"
        )
    return response - 1, None


def _answer(row: _Row) -> _Answer:
    accuracy = row.get("scores", "any")
    if not isinstance(accuracy, dict) or accuracy.get("accuracy") not in (0, 1):
        _fail(row.path, f"{row.where}'scores' should be {{\"accuracy\": 0 or 1}}")
    a = _Answer(
        query=row.get("query", "str"),
        gold=row.get("answer", "int"),
        gold_state=row.get("answer_state", "str list"),
        gold_text=row.get("answer_choice", "str"),
        raw=row.get("raw_response", "str"),
        response=row.get("response", "pick"),
        response_text=row.get("response_choice", "str"),
        json_error=row.get("json_error", "bool"),
        published_accuracy=float(accuracy["accuracy"]),
    )
    response_state = row.get("response_state", "list")
    if a.gold < 0:
        _fail(row.path, f"{row.where}'answer' (the gold option, 0-based) is negative")
    if not a.json_error and a.response >= 1:
        same = a.response - 1 == a.gold
        if same != (response_state == a.gold_state) or same != bool(a.published_accuracy):
            _fail(
                row.path,
                f"{row.where}'response' {a.response} (1-based) and 'answer' {a.gold} (0-based) "
                f"disagree with 'response_state' / 'scores.accuracy'",
            )
    return a


# ---------------------------------------------------------------- the state query


@dataclass
class _StateQuery:
    required_info: list[str]
    true_values: dict[str, str]
    write_periods: dict[str, int]
    state_answers: dict[str, str | None]
    state_json_error: str | None
    state_choices: dict[str, int]


def _sub_schema_sizes(query: str, variables: list[str]) -> dict[str, int]:
    """#values per variable, from the JSON sub-schema the published state query starts with."""
    try:
        schema, _ = json.JSONDecoder().raw_decode(query.lstrip())
    except ValueError:
        return {}
    if not isinstance(schema, dict):
        return {}
    sizes = {}
    for v in variables:
        values = schema.get(v)
        if not isinstance(values, list) or not values:
            return {}
        sizes[v] = len(values)
    return sizes


def _state_query(row: _Row, period: int, answer: _Answer) -> _StateQuery:
    results = row.get("results", "list")
    if len(results) != len(answer.gold_state):
        _fail(
            row.path,
            f"{row.where}{len(results)} state results, but overall_results.json has "
            f"{len(answer.gold_state)} required values for this question",
        )
    sq = _StateQuery([], {}, {}, {}, None, {})
    unparsed = 0
    for i, data in enumerate(results):
        if not isinstance(data, dict):
            _fail(row.path, f"{row.where}results[{i}] should be a JSON object")
        r = _Row(row.path, f"{row.where}results[{i}]: ", data)
        variable = r.get("info_type", "str")
        truth = r.get("answer_state", "str")
        write_pos = r.get("write_pos", "int")
        if truth != answer.gold_state[i]:
            _fail(
                row.path,
                f"{r.where}'answer_state' {_show(truth)} differs from overall_results.json's "
                f"{_show(answer.gold_state[i])} (a diagnosis of another data.json?)",
            )
        if not 0 <= write_pos <= period or r.get("read_pos", "int") != period:
            _fail(row.path, f"{r.where}'write_pos' must be in 0..{period} and 'read_pos' {period}")
        response = r.get("response_state", "any")
        failed = r.get("json_error", "bool")
        if failed:
            response = None
        elif response is not None and not isinstance(response, str):
            response = json.dumps(response, ensure_ascii=False)  # a number, list...: its JSON
        if variable in sq.true_values:
            # the published runs list a variable twice in some questions: the same entry is one
            # state query; two that disagree cannot be told apart
            earlier = (sq.write_periods[variable], sq.state_answers[variable])
            if earlier != (write_pos, response):
                _fail(
                    row.path,
                    f"{r.where}{_show(variable)} appears twice in 'results' with different "
                    "entries (write_pos or response_state)",
                )
            continue
        unparsed += bool(failed)
        sq.required_info.append(variable)
        sq.true_values[variable] = truth
        sq.write_periods[variable] = write_pos
        sq.state_answers[variable] = response
    if unparsed == len(sq.required_info):
        sq.state_json_error = "the state query named none of the variables (published json_error)"
    sq.state_choices = _sub_schema_sizes(row.get("query", "str"), sq.required_info)
    return sq


# ---------------------------------------------------------------- the upper bound


@dataclass
class _UbOption:
    query: str
    state: list[str]
    text: str
    chosen: int | None  # memloop's reading of the bare LLM's pick for this option's state
    error: str | None


def _load_upper_bound(ub_dir: Path) -> list[list[list[_UbOption]]]:
    """`[item][question][option]` of a published upper-bound folder, checked."""
    if not ub_dir.is_dir():
        _fail(ub_dir, "not a folder (--upper-bound takes the published <output_dir>/<llm model>)")
    path = ub_dir / UB_FILE
    data = _load_json(path, "--upper-bound takes the folder eval/upperbound.py wrote it in")
    if not isinstance(data, list) or not data:
        _fail(path, "expected a non-empty list of items (users), each a list of questions")
    items = []
    for i, item in enumerate(data):
        interrupt.check()
        if not isinstance(item, list) or not item:
            _fail(path, f"item {i}: expected a non-empty list of questions")
        questions = []
        for q, raw in enumerate(item):
            if not isinstance(raw, list) or not raw:
                _fail(path, f"item {i} question {q}: expected a non-empty list of options")
            parsed = []
            for c, data_c in enumerate(raw):
                row = _published_row(path, f"item {i} question {q} option {c}: ", data_c)
                if row.get("answer", "int") != c + 1:
                    _fail(path, f"{row.where}'answer' should be {c + 1} (the option, 1-based)")
                response = row.get("response", "pick")
                json_error = row.get("json_error", "bool")
                if not json_error and response > len(raw):
                    _fail(
                        path, f"{row.where}'response' {response} is beyond the {len(raw)} options"
                    )
                chosen, error = _pick(response, json_error, len(raw), "the upper-bound answer")
                parsed.append(
                    _UbOption(
                        query=row.get("query", "str"),
                        state=row.get("answer_state", "str list"),
                        text=row.get("answer_choice", "str"),
                        chosen=chosen,
                        error=error,
                    )
                )
            questions.append(parsed)
        items.append(questions)
    return items


def _ub_item(
    path: Path, user: str, answers: list[list[_Answer]], items: list[list[list[_UbOption]]]
) -> list[list[_UbOption]]:
    """The upper-bound item with this user's questions and gold options (items carry no id)."""
    queries = [a.query for a in answers[0]]

    def fits(item: list[list[_UbOption]]) -> bool:
        if [options[0].query for options in item] != queries:
            return False
        return all(
            a.gold < len(item[q])
            and item[q][a.gold].state == a.gold_state
            and item[q][a.gold].text == a.gold_text
            for row in answers
            for q, a in enumerate(row)
        )

    found = [i for i, item in enumerate(items) if fits(item)]
    if not found:
        _fail(
            path,
            f"no item has the questions and gold options of user {user} (was the upper bound "
            "run on the same data.json?)",
        )
    if len(found) > 1:
        _fail(path, f"items {found[0]} and {found[1]} both match user {user}: ambiguous")
    return items[found[0]]


# ---------------------------------------------------------------- the run


@dataclass
class ImportedRun:
    records: list[QuestionRecord]  # in (user, period, question) order
    published_accuracy: dict[tuple[str, int, int], float]  # `scores.accuracy` as published
    published_json_errors: int
    has_upper_bound: bool
    has_diagnosis: bool
    run_dir: Path
    upper_bound_dir: Path | None


def _user_folders(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        _fail(run_dir, "not a folder (RUN_DIR is the published <output_dir>/<agent name>)")
    if (run_dir / OVERALL_FILE).is_file():
        _fail(
            run_dir,
            f"this is one user's folder (it holds {OVERALL_FILE}); pass the folder above it, "
            "which holds one folder per user",
        )
    folders = sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        _fail(run_dir, f"no user folders (a published run has one per user, with {OVERALL_FILE})")
    for folder in folders:
        if not (folder / OVERALL_FILE).is_file():
            if any((folder / m).exists() for m in _USER_MARKERS):
                hint = "the published run did not get to this user's questions"
            elif any((sub / OVERALL_FILE).is_file() for sub in folder.iterdir() if sub.is_dir()):
                hint = "RUN_DIR holds several agents' runs: pass one <agent name> folder"
            else:
                hint = "every sub-folder of RUN_DIR should be a user folder of a published run"
            _fail(folder / OVERALL_FILE, f"missing ({hint})")
    return folders


def read_run(run_dir: str | Path, upper_bound_dir: str | Path | None = None) -> ImportedRun:
    """Read and check a published run (and its upper bound) completely; write nothing."""
    run_dir = Path(run_dir)
    folders = _user_folders(run_dir)
    diagnosed = [f for f in folders if (f / DIAGNOSIS_FILE).is_file()]
    if diagnosed and len(diagnosed) != len(folders):
        missing = next(f for f in folders if f not in diagnosed)
        _fail(
            missing / DIAGNOSIS_FILE,
            f"missing, while {len(diagnosed)} of {len(folders)} users have one (run the "
            "published eval/diagnosis.py for every user, or import a copy without them)",
        )
    ub_items = None
    if upper_bound_dir is not None:
        ub_items = _load_upper_bound(Path(upper_bound_dir))
    run = ImportedRun(
        records=[],
        published_accuracy={},
        published_json_errors=0,
        has_upper_bound=ub_items is not None,
        has_diagnosis=bool(diagnosed),
        run_dir=run_dir,
        upper_bound_dir=None if upper_bound_dir is None else Path(upper_bound_dir),
    )
    for folder in folders:
        interrupt.check()  # Ctrl-C stops here even when its KeyboardInterrupt was swallowed
        _read_user(folder, run, ub_items)
    return run


def _read_user(
    folder: Path, run: ImportedRun, ub_items: list[list[list[_UbOption]]] | None
) -> None:
    user = folder.name
    opath = folder / OVERALL_FILE
    answers = [
        [_answer(row) for row in period]
        for period in _grid(opath, _load_json(opath, "written by eval/overall.py"))
    ]
    for p, row in enumerate(answers):
        for q, a in enumerate(row):
            if a.query != answers[0][q].query:
                _fail(opath, f"period {p} question {q}: another question than in period 0")
    diagnosis = None
    dpath = folder / DIAGNOSIS_FILE
    if run.has_diagnosis:
        diagnosis = _grid(dpath, _load_json(dpath, "written by eval/diagnosis.py"))
        shape = (len(diagnosis), len(diagnosis[0]))
        if shape != (len(answers), len(answers[0])):
            _fail(
                dpath,
                f"{shape[0]} periods x {shape[1]} questions, but {OVERALL_FILE} has "
                f"{len(answers)} x {len(answers[0])}",
            )
    ub = None
    if ub_items is not None and run.upper_bound_dir is not None:
        ub = _ub_item(run.upper_bound_dir / UB_FILE, user, answers, ub_items)
    first: dict[int, list[str]] = {}  # question -> its variables in period 0
    for p, row in enumerate(answers):
        for q, a in enumerate(row):
            record = _record(user, p, q, a, opath, ub[q] if ub is not None else None)
            if diagnosis is not None:
                _add_state_query(record, _state_query(diagnosis[p][q], p, a))
                if first.setdefault(q, record.required_info) != record.required_info:
                    _fail(dpath, f"period {p} question {q}: other variables than in period 0")
            run.records.append(record)
            run.published_accuracy[(user, p, q)] = a.published_accuracy
            run.published_json_errors += a.json_error


def _record(
    user: str, p: int, q: int, a: _Answer, opath: Path, options: list[_UbOption] | None
) -> QuestionRecord:
    """The record of one published answer; the options and the upper bound when known."""
    n = None if options is None else len(options)
    if n is not None and not a.json_error and a.response > n:
        _fail(opath, f"period {p} question {q}: 'response' {a.response} is beyond the {n} options")
    chosen, error = _pick(a.response, a.json_error, n, "the answer")
    record = QuestionRecord(
        user_id=user,
        period=p,
        question_index=q,
        question=a.query,
        choices=[] if options is None else [o.text for o in options],
        required_info=[],
        gold_index=a.gold,
        true_values={},
        write_periods={},
        chosen_index=chosen,
        json_error=error,
        raw_response=a.raw,
    )
    if options is not None:
        if chosen is not None and options[chosen].text != a.response_text:
            _fail(
                opath,
                f"period {p} question {q}: 'response_choice' is not option {a.response} of the "
                "upper-bound run",
            )
        record.ub_chosen_index = options[a.gold].chosen
        record.ub_json_error = options[a.gold].error
    return record


def _add_state_query(record: QuestionRecord, sq: _StateQuery) -> None:
    record.required_info = sq.required_info
    record.true_values = sq.true_values
    record.write_periods = sq.write_periods
    record.state_answers = sq.state_answers
    record.state_json_error = sq.state_json_error
    record.state_choices = sq.state_choices


# ---------------------------------------------------------------- metrics and files

_NO_CONTROL = ("no_memory", "memory_gain")
_NEEDS_UB = (
    "random",
    "upper_bound",
    "memory_score",
    "memory_score_undefined_periods",
    "memory_score_cell_mean",
    "memory_score_undefined_cells",
)
_NEEDS_DIAGNOSIS = ("state_accuracy", "state_chance", "state_score")


def _blank(group: dict[str, Any], run: ImportedRun) -> None:
    """Set to None the numbers the scorer filled in from fields the published files lack."""
    names = list(_NO_CONTROL)
    if not run.has_upper_bound:
        names += _NEEDS_UB
    if not run.has_diagnosis:
        names += _NEEDS_DIAGNOSIS
        if "diagnosis" in group:  # the `format` share needs no diagnosis
            group["diagnosis"].update(write=None, read=None, utilization=None)
    for name in names:
        if name in group:
            group[name] = None


def build_import_metrics(run: ImportedRun) -> dict[str, Any]:
    """metrics.json of an imported run: memloop's `build_metrics`, honest about what is missing."""
    scored = run.records
    if not run.has_upper_bound:  # the scorer needs a number of options; the values are blanked
        scored = [r.model_copy(update={"choices": [_UNKNOWN_OPTION]}) for r in run.records]
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in scored:
        cells.setdefault((r.user_id, r.period), []).append(r.model_dump(mode="json"))
    period_records = [
        PeriodRecord(user_id=u, period=p, mode="imported", sessions=[], probes={"questions": qs})
        for (u, p), qs in cells.items()
    ]
    metrics, notes = build_metrics(period_records)
    _blank(metrics, run)
    for row in metrics["per_period"]:
        _blank(row, run)
        row["published_overall"] = mean(
            v for (_, p, _), v in run.published_accuracy.items() if p == row["period"]
        )
    for row in metrics["per_user"].values():
        _blank(row, run)
    metrics["published_overall"] = mean(run.published_accuracy.values())
    if not run.has_upper_bound:
        notes = []  # every scoring warning is about the memory score, which is not computed
    if notes:
        metrics["warnings"] = notes
    not_imported = list(NOT_IMPORTED)
    if not run.has_upper_bound:
        not_imported.append(NOT_IMPORTED_WITHOUT_UB)
    if not run.has_diagnosis:
        not_imported.append(NOT_IMPORTED_WITHOUT_DIAGNOSIS)
    metrics["imported_from"] = {
        "format": FORMAT,
        "run_dir": str(run.run_dir.resolve()),
        "upper_bound_dir": None
        if run.upper_bound_dir is None
        else str(run.upper_bound_dir.resolve()),
        "diagnosis": run.has_diagnosis,
        "published_json_errors": run.published_json_errors,
        "not_imported": not_imported,
    }
    return metrics


def records_jsonl(run: ImportedRun) -> str:
    """records.jsonl: one QuestionRecord a line, with `correct` and `ub_correct` like eval's."""
    lines = []
    for r in run.records:
        row = r.model_dump(mode="json")
        row["correct"] = r.correct
        row["ub_correct"] = r.ub_correct if run.has_upper_bound else None
        lines.append(json.dumps(row, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def import_run(
    run_dir: str | Path, out_dir: str | Path, upper_bound_dir: str | Path | None = None
) -> dict[str, Any]:
    """Import a published AMemGym run into `out_dir` (records.jsonl, metrics.json); the metrics.

    Everything is read and checked first: on bad input a UserError names the file and nothing is
    written. `out_dir` may hold an earlier import (its metrics.json says `imported_from`), whose
    two files are replaced; a records.jsonl or metrics.json memloop did not import there, or a
    memloop run folder (spec.json), is refused in one line.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        _fail(out, "exists and is not a folder (--out)")
    check_out_folder(out)
    run = read_run(run_dir, upper_bound_dir)
    metrics = build_import_metrics(run)
    text = records_jsonl(run)
    check_out_folder(out)  # again: reading a large run takes a while
    interrupt.check()  # the last moment to stop with nothing written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(out, f"cannot create the folder ({exc.strerror})")
    atomic_write_text(out / RECORDS_FILE, text)
    try:
        atomic_write_json(out / METRICS_FILE, metrics, indent=2)
    except BaseException:  # records.jsonl without its metrics.json would not be known as ours
        (out / RECORDS_FILE).unlink(missing_ok=True)
        raise
    return metrics


def is_import_metrics(path: Path) -> bool:
    """Whether `path` is the metrics.json of an import (`imported_from` this format)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    source = document.get("imported_from") if isinstance(document, dict) else None
    return isinstance(source, dict) and source.get("format") == FORMAT


def check_out_folder(out: Path) -> None:
    """Refuse an --out folder whose records.jsonl or metrics.json is not an earlier import's."""
    if (out / "spec.json").exists():
        _fail(
            out,
            "holds a memloop run (spec.json): its records.jsonl and metrics.json are not an "
            "import's to replace; choose another --out",
        )
    mark = "an import's metrics.json names the run it came from in 'imported_from'"
    refuse_foreign_file(out / METRICS_FILE, "--out", is_import_metrics, mark)
    if not (out / METRICS_FILE).is_file():  # records.jsonl alone: no metrics.json says whose
        refuse_foreign_file(out / RECORDS_FILE, "--out", lambda path: False, mark)
