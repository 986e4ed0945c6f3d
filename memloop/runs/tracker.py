"""MLflow logging and reading for evolution, tuning and the commands that read runs back.

One run per condition, found again by a key tag (so a restarted command continues the same run),
metrics with step = cycle logged at most once per step, prompts and feedback summaries as
artifacts, and each cycle's prompt as a version in the prompt registry with the alias `best` on
the best one; and the readers memloop.results uses (experiments, runs, artifacts).

With runs/tracker_store.py (tracking URIs, the client, the store's failures; its public names are
re-exported here) this is the only code in memloop that talks to MLflow.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import safe_name, sqlite_file, store_lock
from memloop.core.settings import quiet_logger, traces_enabled
from memloop.runs.spec import KEY_TAG, RunSpec, git_revision
from memloop.runs.traces import TRACE_TAG, SessionTrace, Span
from memloop.runs.tracker_store import (
    SERVER_PROBE_S,
    SQLITE_BUSY_TIMEOUT,
    TRACKING_URI_FORMS,
    check_server,
    check_store,
    check_tracking_uri,
    client,
    local_store,
    mlflow_module,
    process_lock,
    require_store,
    store_errors,
    store_failure,
    uri_of,
)

EXPERIMENT_TAGS = {
    # MLflow 3 opens a GenAI experiment on its (empty) traces page; these are runs to compare
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": "memloop runs: one MLflow run per condition (evolve) or trial (tune); "
    "read them with `memloop compare --experiment NAME`, take a prompt with `memloop export`.",
}


MAX_EXPERIMENT_NAME = 500  # MLflow's own limit (mlflow.utils.validation)


def experiment_name_problem(name: str) -> str | None:
    """Why MLflow would refuse `name` as an experiment's name (None: it takes it).

    Checked before a run starts, so that no work ends in MLflow's traceback.
    """
    if not name.strip():
        return "is empty: give the experiment a name"
    if len(name) > MAX_EXPERIMENT_NAME:
        return f"is {len(name)} characters long; MLflow takes at most {MAX_EXPERIMENT_NAME}"
    return None


def experiment_id(mlc, name: str, tracking_uri: str) -> str:
    """The id of experiment `name`, created (with memloop's experiment tags) when missing."""
    with store_errors(tracking_uri):
        exp = mlc.get_experiment_by_name(name)
        if exp is not None:
            for key, value in EXPERIMENT_TAGS.items():
                if key not in exp.tags:  # an experiment made by an older memloop
                    mlc.set_experiment_tag(exp.experiment_id, key, value)
            return exp.experiment_id
        location = None
        db = sqlite_file(tracking_uri)
        if db is not None:
            location = (db.parent.resolve() / "artifacts" / safe_name(name)).as_uri()
        return mlc.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)


def open_run(
    mlc,
    exp_id: str,
    run_key: str,
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
) -> tuple[str, bool]:
    """(run id, resumed): the run tagged with `run_key`, or a new one with `params` (flat) logged.

    Looking up and creating happen under one lock shared by every process using the store (a
    file lock beside a sqlite store), so two workers never create the same run twice. A resumed
    run gets the params it lacks: a kill between creating a run and logging its params left it
    without them for good.
    """
    uri = uri_of(mlc)
    flat = {k[:250]: str(v)[:6000] for k, v in sorted(params.items())}
    with store_errors(uri):
        with process_lock, store_lock(uri):
            found = mlc.search_runs(
                [exp_id], filter_string=f"tags.`{KEY_TAG}` = '{run_key}'", max_results=1
            )
            if found:
                run_id = found[0].info.run_id
                if found[0].info.status != "RUNNING":
                    mlc.update_run(run_id, status="RUNNING")
                logged = found[0].data.params
                _log_params(mlc, run_id, {k: v for k, v in flat.items() if k not in logged})
                return run_id, True
            all_tags = {KEY_TAG: run_key, "mlflow.runName": run_name, **(tags or {})}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = mlc.create_run(exp_id, run_name=run_name, tags=all_tags)
            run_id = run.info.run_id
        _log_params(mlc, run_id, flat)
        return run_id, False


def log_run(
    mlc,
    exp_id: str,
    spec: RunSpec,
    run_name: str,
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
) -> tuple[str, bool]:
    """(run id, resumed): the MLflow run of `spec` (its key, its params, its tags and `tags`).

    MLflow's Source column names the command (`memloop evolve`), and the code's git commit when
    memloop runs from a checkout.
    """
    revision = git_revision()
    source = {"mlflow.source.name": f"memloop {spec.kind}", "mlflow.source.type": "LOCAL"}
    if revision:
        source["mlflow.source.git.commit"] = revision
    return open_run(
        mlc,
        exp_id,
        spec.key(),
        run_name,
        spec.params(),
        tags={**spec.tags(), **source, **(tags or {})},
        parent_run_id=parent_run_id,
    )


def finish_run(mlc, run_id: str, status: str = "FINISHED") -> None:
    """Mark the run ended with `status`.

    Called while another exception propagates (a run marked KILLED or FAILED on the way out,
    a Ctrl-C included), any failure here is not reported: that exception is the one the user
    sees. (A Ctrl-C in the middle of MLflow's first import leaves its store modules half made,
    and this call then failed inside SQLAlchemy, replacing the Ctrl-C by a traceback.)
    """
    in_flight = sys.exc_info()[1] is not None
    try:
        with store_errors(uri_of(mlc)):
            mlc.set_terminated(run_id, status=status)
    except Exception:
        if not in_flight:
            raise


def logged_steps(mlc, run_id: str, key: str) -> set[int]:
    with store_errors(uri_of(mlc)):
        return {m.step for m in mlc.get_metric_history(run_id, key)}


def log_metrics(mlc, run_id: str, metrics: dict[str, float | None], step: int) -> None:
    """Log each metric at `step` unless already there (a resumed cycle logs nothing twice)."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    with store_errors(uri_of(mlc)):
        batch = [
            Metric(k, float(v), now, step)
            for k, v in sorted(metrics.items())
            if v is not None and step not in logged_steps(mlc, run_id, k)
        ]
        if batch:
            mlc.log_batch(run_id, metrics=batch)


def log_text(mlc, run_id: str, text: str, artifact_file: str) -> None:
    with store_errors(uri_of(mlc)):
        mlc.log_text(run_id, text, artifact_file)


def log_figure(mlc, run_id: str, paths: list[Path], artifact_path: str = "figures") -> None:
    """Each file of `paths` as an artifact of run `run_id` under `artifact_path`.

    By run id: the run may have ended. A file logged again replaces the earlier one.
    """
    with store_errors(uri_of(mlc)):
        for path in paths:
            mlc.log_artifact(run_id, str(path), artifact_path)


def has_figures(mlc, run_id: str, paths: list[Path], artifact_path: str = "figures") -> bool:
    """Whether run `run_id` holds each file of `paths` under `artifact_path`, whole.

    Whole: listed with the local file's size (a process killed while it logged the file, or
    before, leaves it missing or shorter).
    """
    with store_errors(uri_of(mlc)):
        listed = {
            Path(a.path).name: a.file_size
            for a in mlc.list_artifacts(run_id, artifact_path)
            if not a.is_dir
        }
    return all(listed.get(p.name) == p.stat().st_size for p in paths)


def name_run(mlc, run_id: str, run_name: str, tags: dict[str, str] | None = None) -> None:
    """Rename run `run_id` to `run_name` and set `tags` on it (a resumed run renamed)."""
    with store_errors(uri_of(mlc)):
        mlc.update_run(run_id, name=run_name)
        set_tags(mlc, run_id, dict(sorted((tags or {}).items())))


def prompt_name(*parts: str) -> str:
    return safe_name(".".join(parts))[:200]


def render_prompts(prompts: dict[str, str]) -> str:
    """One text for the registry: a section per predictor (single predictor: its text)."""
    if len(prompts) == 1:
        return next(iter(prompts.values()))
    return "\n\n".join(f"## {name}\n{text}" for name, text in sorted(prompts.items()))


def register_prompt(
    mlc,
    name: str,
    prompts: dict[str, str],
    *,
    cycle: int,
    run_id: str,
    score: float | None,
    objective: str = "memory_score",
) -> int:
    """The registry version holding this (run, cycle)'s prompts, linked to the run.

    A new version only when the text is new to `name`: a cycle whose prompts an earlier cycle
    (or run) registered gets that version (an unchanged prompt is not registered again). The
    prompt is linked to the run's experiment, so the experiment's Prompts page lists it.
    """
    mlflow = mlflow_module()
    text = render_prompts(prompts)
    with process_lock, store_errors(uri_of(mlc)):
        existing = _versions(mlc, name)
        for v in existing:
            if v.tags.get("memloop.run_id") == run_id and v.tags.get("memloop.cycle") == str(cycle):
                return int(v.version)
        experiment_id = mlc.get_run(run_id).info.experiment_id
        same = [v for v in existing if v.template == text]
        if same:
            version = max(same, key=lambda v: int(v.version))
        else:
            tags = {
                "memloop.run_id": run_id,
                "memloop.cycle": str(cycle),
                "memloop.predictors": ",".join(sorted(prompts)),
            }
            if score is not None:
                tags[f"memloop.val_{objective}"] = f"{score:.6f}"  # what selection ranks on
            # MLflow links a new version to the active experiment (else Default) by itself, in
            # a thread of its own: the run's experiment is made the active one first, and the
            # thread is waited for (two writers of the tag at once collide)
            mlflow.set_experiment(experiment_id=experiment_id)
            version = mlflow.genai.register_prompt(
                name=name, template=text, commit_message=f"cycle {cycle}", tags=tags
            )
            for thread in threading.enumerate():
                if thread.name.startswith("link_prompt_to_experiment_thread"):
                    thread.join()
        _link_to_experiment(mlc, name, experiment_id)  # when MLflow's own link did not happen
        # the run's page lists the prompt versions it used, and each version its runs
        mlc.link_prompt_version_to_run(run_id, version)
        return int(version.version)


EXPERIMENT_IDS_TAG = "_mlflow_experiment_ids"
"""The prompt tag MLflow's experiment Prompts page filters on: ",<id>,<id>,"."""


def _link_to_experiment(mlc, name: str, experiment_id: str) -> None:
    """Tag prompt `name` with `experiment_id` (kept with the ones it has), here and now."""
    held = (mlc.get_prompt(name).tags or {}).get(EXPERIMENT_IDS_TAG, "")
    ids = [i for i in held.strip(",").split(",") if i]
    if experiment_id not in ids:
        mlc.set_prompt_tag(name, EXPERIMENT_IDS_TAG, f",{','.join([*ids, experiment_id])},")


def split_prompts(template: str, names: list[str], where: str) -> dict[str, str]:
    """`render_prompts`'s inverse for the predictor `names` (sorted); refused unless exact."""
    if len(names) == 1:
        return {names[0]: template}
    if any(template.count(f"\n\n## {name}\n") != 1 for name in names[1:]):
        raise UserError(f"{where}: the template's sections are ambiguous; export the run instead")
    if not template.startswith(f"## {names[0]}\n"):
        raise UserError(f"{where}: the template has no section {names[0]!r}")
    rest = template[len(f"## {names[0]}\n") :]
    out: dict[str, str] = {}
    for name, following in zip(names, names[1:], strict=False):
        text, sep, rest = rest.partition(f"\n\n## {following}\n")
        if not sep:
            raise UserError(f"{where}: the template has no section {following!r}")
        out[name] = text
    out[names[-1]] = rest
    if render_prompts(out) != template:
        raise UserError(f"{where}: the template is not one memloop rendered; export the run")
    return out


def registered_prompts(tracking_uri: str, uri: str) -> dict[str, str]:
    """The prompts of a registry version: ``prompts:/NAME@ALIAS`` or ``prompts:/NAME/VERSION``.

    The version must be one memloop registered (its ``memloop.predictors`` tag names the
    predictors its template holds).
    """
    version = _registered_version(tracking_uri, uri)
    predictors = (version.tags or {}).get("memloop.predictors")
    if not predictors:
        raise UserError(
            f"prompts_from {uri!r}: version {version.version} was not registered by memloop "
            "(no memloop.predictors tag): its predictor names are unknown"
        )
    return split_prompts(version.template, predictors.split(","), f"prompts_from {uri!r}")


def registered_source(tracking_uri: str, uri: str) -> dict[str, str]:
    """Where a registry version came from: `memloop.prompts_from.run` / `.cycle` / `.version`."""
    version = _registered_version(tracking_uri, uri)
    tags = version.tags or {}
    out = {"memloop.prompts_from.version": f"{version.name}/{version.version}"}
    if "memloop.run_id" in tags:
        out["memloop.prompts_from.run"] = tags["memloop.run_id"]
    if "memloop.cycle" in tags:
        out["memloop.prompts_from.cycle"] = tags["memloop.cycle"]
    return out


def _registered_version(tracking_uri: str, uri: str) -> Any:
    match = re.fullmatch(r"prompts:/([^/@]+)(?:@([^/@]+)|/(\d+))", uri)
    if match is None:
        raise UserError(
            f"prompts_from {uri!r}: expected prompts:/NAME@ALIAS (e.g. @best) or "
            "prompts:/NAME/VERSION, or a file"
        )
    name, alias, number = match.groups()
    mlc = client(tracking_uri, create=False)
    from mlflow.exceptions import MlflowException

    try:
        if alias is not None:
            version = mlc.get_prompt_version_by_alias(name, alias)
        else:
            version = mlc.get_prompt_version(name, number)
    except MlflowException as exc:
        raise UserError(
            f"prompts_from {uri!r}: not in the prompt registry of {tracking_uri} "
            f"({str(exc).splitlines()[0]})"
        ) from None
    if version is None:
        raise UserError(f"prompts_from {uri!r}: not in the prompt registry of {tracking_uri}")
    return version


def set_best(mlc, name: str, version: int) -> None:
    with store_errors(uri_of(mlc)):
        mlflow_module().genai.set_prompt_alias(name, alias="best", version=version)


def _versions(mlc, name: str) -> list[Any]:
    try:
        return list(mlc.search_prompt_versions(name))
    except UserError:
        raise  # the store failed: not "no versions yet"
    except Exception as exc:
        if store_failure(exc, uri_of(mlc), sqlite_file(uri_of(mlc), create_folder=False)):
            raise
        return []


DESCRIPTION_TAG = "mlflow.note.content"
"""The tag MLflow shows as a run's description."""


def log_params_once(mlc, run_id: str, params: dict[str, str]) -> None:
    """Log the `params` run `run_id` does not have yet.

    A param's value never changes in MLflow; a rerun of a finished run computes the same ones.
    """
    with store_errors(uri_of(mlc)):
        held = mlc.get_run(run_id).data.params
        _log_params(mlc, run_id, {k: v for k, v in params.items() if k not in held})


def _log_params(mlc, run_id: str, params: dict[str, str]) -> None:
    """`params` in batches of 100 (MLflow's limit per call)."""
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):
        mlc.log_batch(run_id, params=items[i : i + 100])


def set_tags(mlc, run_id: str, tags: dict[str, str]) -> None:
    """Set `tags` on run `run_id`, in the order given."""
    for key, value in tags.items():
        mlc.set_tag(run_id, key, value)


# -- episodes as traces -------------------------------------------------------------------------


SPANS_TAG = "memloop.spans"  # the spans a whole trace holds: a trace with fewer is partial
ASSESSMENTS_TAG = "memloop.assessments"  # the question results a whole trace holds
TRACING_LOGGER = "mlflow.tracing.client"


RUN_TRACE_TAG = "memloop.run"  # the run a trace was logged for, linked to it or not yet


def _run_traces(mlc, experiment_id: str, run_id: str, *, spans: bool) -> list[Any]:
    """Every trace of run `run_id` (with their spans: those whose spans can be read).

    The traces linked to the run, and those tagged for it (`RUN_TRACE_TAG`) whose link a kill
    prevented.
    """
    found: dict[str, Any] = {}
    # a trace whose span file was never written is left out of a search with spans, with a
    # warning from MLflow's client per trace (`logged_traces` removes such traces)
    with quiet_logger(TRACING_LOGGER):
        for where in ({"run_id": run_id}, {"filter_string": f"tag.`{RUN_TRACE_TAG}` = '{run_id}'"}):
            token = None
            while True:
                page = mlc.search_traces(
                    locations=[experiment_id],
                    max_results=500,
                    page_token=token,
                    include_spans=spans,
                    **where,
                )
                found.update((t.info.trace_id, t) for t in page)
                token = page.token
                if not token:
                    break
    return list(found.values())


def logged_traces(mlc, experiment_id: str, run_id: str, keys: set[str]) -> set[str]:
    """Which of `keys` (a batch's `memloop.trace` keys) run `run_id` holds whole traces of.

    Whole: finished (state OK) and holding every span and question result (assessment) it was
    logged with (`SPANS_TAG`, `ASSESSMENTS_TAG`). A kill
    while MLflow writes a batch leaves traces in progress without a key, keyed traces whose
    spans were never written, or some spans only: those, and a second copy of a key, are
    deleted, and the rerun logs their keys again, so the run's traces are those of a run never
    interrupted. Only the batch's own traces have their spans read (a run's earlier cycles'
    are not read again at every cycle).
    """
    whole: dict[str, str] = {}  # key -> trace id
    broken: list[str] = []
    with store_errors(uri_of(mlc)):
        for info in (t.info for t in _run_traces(mlc, experiment_id, run_id, spans=False)):
            key = info.tags.get(TRACE_TAG)
            if key is not None and key not in keys:
                continue  # another batch's
            if key is None or key in whole or str(info.state) != "OK":
                broken.append(info.trace_id)
                continue
            try:
                with quiet_logger(TRACING_LOGGER):  # a missing span file: its warning
                    found = mlc.get_trace(info.trace_id)
                spans, assessed = len(found.data.spans), len(found.info.assessments)
            except Exception:  # its span file was never written
                spans, assessed = 0, 0
            expected = info.tags.get(SPANS_TAG)
            # a trace logged before SPANS_TAG (or ASSESSMENTS_TAG) existed: whole when it has
            # spans (whatever its assessments)
            if (spans > 0 if expected is None else expected == str(spans)) and info.tags.get(
                ASSESSMENTS_TAG, str(assessed)
            ) == str(assessed):
                whole[key] = info.trace_id
            else:
                broken.append(info.trace_id)
        for start in range(0, len(broken), 100):
            mlc.delete_traces(experiment_id, trace_ids=broken[start : start + 100])
        if whole:  # whole traces a kill left unlinked (links that exist are kept as they are)
            ids = list(whole.values())
            for start in range(0, len(ids), TRACE_BATCH):
                mlc.link_traces_to_run(ids[start : start + TRACE_BATCH], run_id)
    return set(whole)


def _span_count(span: Span) -> int:
    return 1 + sum(_span_count(child) for child in span.children)


def log_traces(mlc, run_id: str, traces: list[SessionTrace]) -> int:
    """Log each of `traces` not logged whole for run `run_id` before; how many were logged now.

    Each is linked to the run and grouped in MLflow sessions (one per user and cycle). What a
    kill left of an earlier batch is repaired first (`logged_traces`). The traces go to the
    store in batches of `TRACE_BATCH` (`_log_batch`: one store transaction for a batch's spans,
    one for its link to the run); a store without `log_spans` (a file store) gets them one span
    at a time through MLflow's tracing API.
    """
    if not traces or not traces_enabled():
        return 0
    with store_errors(uri_of(mlc)):
        experiment_id = mlc.get_run(run_id).info.experiment_id
        if _artifacts_moved(mlc, experiment_id):
            return 0  # MLflow would write trace files at the store's old, recorded place
        done = logged_traces(mlc, experiment_id, run_id, {t.key for t in traces})
        todo = [t for t in traces if t.key not in done]
        for start in range(0, len(todo), TRACE_BATCH):
            batch = todo[start : start + TRACE_BATCH]
            if not _log_batch(mlc, experiment_id, run_id, batch):
                _log_live(mlc, experiment_id, run_id, todo[start:])
                break
    return len(todo)


TRACE_BATCH = 100  # traces per store transaction (MLflow links at most 100 to a run per call)


def _log_batch(mlc, experiment_id: str, run_id: str, traces: list[SessionTrace]) -> bool:
    """`traces` in one `log_spans` call and one call linking them to the run.

    `log_spans` makes each trace from its spans (its tags, session and user from the root
    span's attributes, its previews from the root's chat-shaped inputs and outputs: traces.py):
    one store transaction for the batch, where `start_trace` took one per trace and cost three
    times the spans' CPU. False when the store has no `log_spans` (nothing was written then).
    """
    from mlflow.tracing.client import TracingClient

    built = [_trace_spans(trace, run_id) for trace in traces]
    client = TracingClient(uri_of(mlc))
    try:
        client.log_spans(experiment_id, [s for _, spans in built for s in spans])
    except NotImplementedError:
        return False
    mlc.link_traces_to_run([trace_id for trace_id, _ in built], run_id)
    for trace, (trace_id, _) in zip(traces, built, strict=True):
        _log_assessments(client, trace_id, trace)
    return True


def _log_assessments(client: Any, trace_id: str, trace: SessionTrace) -> None:
    """The trace's question results as MLflow feedback (one store transaction each)."""
    from mlflow.entities import AssessmentSource, Feedback

    source = AssessmentSource(source_type="CODE", source_id="memloop")
    for a in trace.assessments:
        feedback = Feedback(name=a.name, value=a.value, source=source, rationale=a.rationale)
        client.log_assessment(trace_id, feedback)


def _trace_spans(trace: SessionTrace, run_id: str) -> tuple[str, list[Any]]:
    """(trace id, MLflow spans) of one trace, built whole (no live tracing context).

    The root span carries what `log_spans` makes the trace of: its tags
    (`mlflow.traceTag.<key>`), session and user. A model call's span has the times it was made
    (`Span.start_ns`, `end_ns`); a span around timed ones spans them; an untimed span without
    timed ones inside (a memory write, a question) starts where the span before it ended and
    takes no time. A trace without a timed span starts now.
    """
    import random
    import time

    from mlflow.entities.span import Span as MlflowSpan
    from mlflow.tracing.constant import SpanAttributeKey
    from mlflow.tracing.utils import (
        build_otel_context,
        dump_span_attribute_value,
        generate_mlflow_trace_id_from_otel_trace_id,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Status, StatusCode

    otel_trace_id = random.getrandbits(128) or 1
    trace_id = generate_mlflow_trace_id_from_otel_trace_id(otel_trace_id)
    out: list[Any] = []
    resource = Resource.get_empty()

    def build(span: Span, parent: int | None, extra: dict[str, Any], cursor: int) -> int:
        """Append `span` and its children from `cursor` on; the time it ends."""
        span_id = random.getrandbits(64) or 1
        start = cursor if span.start_ns is None else span.start_ns
        end = cursor = start
        for child in span.children:
            cursor = max(cursor, build(child, span_id, {}, cursor))
        end = cursor if span.end_ns is None else span.end_ns
        attributes = {
            SpanAttributeKey.REQUEST_ID: dump_span_attribute_value(trace_id),
            SpanAttributeKey.SPAN_TYPE: dump_span_attribute_value(span.kind),
            SpanAttributeKey.INPUTS: dump_span_attribute_value(span.inputs),
            SpanAttributeKey.OUTPUTS: dump_span_attribute_value(span.outputs),
            **{k: dump_span_attribute_value(v) for k, v in {**span.attributes, **extra}.items()},
        }
        out.append(
            MlflowSpan(
                ReadableSpan(
                    name=span.name,
                    context=build_otel_context(otel_trace_id, span_id),
                    parent=build_otel_context(otel_trace_id, parent) if parent else None,
                    start_time=start,
                    end_time=end,
                    attributes=attributes,
                    status=Status(StatusCode.OK),
                    resource=resource,
                )
            )
        )
        return end

    tags = {**_whole_tags(trace), RUN_TRACE_TAG: run_id}
    build(
        trace.root,
        None,
        {
            **{f"{SpanAttributeKey.TRACE_TAG_PREFIX}{k}": v for k, v in tags.items()},
            SpanAttributeKey.SESSION_ID: trace.session_id,
            "user.id": trace.user,
        },
        _first_time(trace.root) or time.time_ns(),
    )
    return trace_id, out


def _first_time(span: Span) -> int | None:
    """The earliest start of a timed span in `span`'s tree (None: none is timed)."""
    times = [t for t in (span.start_ns, *(_first_time(c) for c in span.children)) if t]
    return min(times) if times else None


def _whole_tags(trace: SessionTrace) -> dict[str, str]:
    """The trace's tags: its own, its key, and what it holds whole (spans, assessments)."""
    return {
        **trace.tags,
        TRACE_TAG: trace.key,
        SPANS_TAG: str(_span_count(trace.root)),
        ASSESSMENTS_TAG: str(len(trace.assessments)),
    }


def _log_live(mlc, experiment_id: str, run_id: str, traces: list[SessionTrace]) -> None:
    """`traces` through MLflow's tracing API, one span at a time (a store without log_spans)."""
    mlflow = mlflow_module()
    from mlflow.tracing.destination import MlflowExperimentLocation

    where = MlflowExperimentLocation(experiment_id)
    made = []
    for trace in traces:
        with mlflow.start_span(
            trace.root.name,
            span_type=trace.root.kind,
            trace_destination=where,
            run_id=run_id,
        ) as root:
            _fill_span(mlflow, root, trace.root)
            # the previews memloop computed; MLflow's own derivation from the root span's
            # inputs and outputs (which may run later, in its store) gives the same text
            mlflow.update_current_trace(
                tags=_whole_tags(trace),
                session_id=trace.session_id,
                user=trace.user,
                request_preview=trace.request_preview or None,
                response_preview=trace.response_preview or None,
            )
            made.append((root.trace_id, trace))
    if traces:
        mlflow.flush_trace_async_logging()
    from mlflow.tracing.client import TracingClient

    client = TracingClient(uri_of(mlc))
    for trace_id, trace in made:
        _log_assessments(client, trace_id, trace)


def _artifacts_moved(mlc, experiment_id: str) -> bool:
    """The experiment's recorded artifact folder is outside its sqlite store's folder and gone.

    A store moved with its project folder: memloop reads and writes run artifacts under the
    moved store, but MLflow's trace export would recreate the old, recorded path.
    """
    db = sqlite_file(uri_of(mlc), create_folder=False)
    location = mlc.get_experiment(experiment_id).artifact_location or ""
    if db is None or not location.startswith("file://"):
        return False
    from urllib.parse import urlparse

    folder = Path(urlparse(location).path)
    return not folder.exists() and not folder.is_relative_to(db.resolve().parent)


def _fill_span(mlflow: Any, live: Any, span: Span) -> None:
    live.set_inputs(span.inputs)
    if span.attributes:
        live.set_attributes(span.attributes)
    for child in span.children:
        with mlflow.start_span(child.name, span_type=child.kind) as sub:
            _fill_span(mlflow, sub, child)
    live.set_outputs(span.outputs)


# -- reading runs back (memloop.results, the ui command) ----------------------------------------


def find_experiment(mlc, name: str) -> Any | None:
    """The experiment named `name`, or None."""
    return mlc.get_experiment_by_name(name)


def experiment_names(mlc) -> list[str]:
    """The names of every experiment in the store."""
    return [e.name for e in mlc.search_experiments()]


def experiment_runs(mlc, experiment_id: str) -> list[Any]:
    """The runs of an experiment, oldest first."""
    return list(mlc.search_runs([experiment_id], order_by=["attributes.start_time ASC"]))


def run_by_id(mlc, run_id: str) -> Any | None:
    """The run with id `run_id`, or None when the store has none."""
    from mlflow.exceptions import MlflowException

    try:
        return mlc.get_run(run_id)
    except MlflowException:
        return None


def runs_named(mlc, name: str) -> list[Any]:
    """The runs named `name`, over every experiment."""
    experiments = [e.experiment_id for e in mlc.search_experiments()]
    if not experiments:
        return []
    quoted = name.replace("'", "\\'")
    return list(mlc.search_runs(experiments, f"attributes.run_name = '{quoted}'"))


def artifact_paths(mlc, run_id: str, folder: str) -> list[str]:
    """The paths of the artifacts in `folder` of run `run_id`."""
    return [a.path for a in mlc.list_artifacts(run_id, folder)]


def artifact_text(mlc, run_id: str, path: str) -> str:
    """The text of artifact `path` of run `run_id`."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return Path(mlc.download_artifacts(run_id, path, tmp)).read_text()


def ui_command(tracking_uri: str, port: int, workers: int) -> tuple[list[str], dict[str, str]]:
    """(argv, environment variables) of MLflow's UI on `tracking_uri` at 127.0.0.1:`port`."""
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        tracking_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        # quiet: no "registry store not provided" line, no per-request and start-up INFO lines
        "--registry-store-uri",
        tracking_uri,
        "--uvicorn-opts",
        "--log-level warning",
    ]
    env = {
        "MLFLOW_LOGGING_LEVEL": "WARNING",  # the job executor's INFO lines
        # starlette deprecates the WSGI bridge MLflow 3.17 imports: not the user's to act on
        "PYTHONWARNINGS": "ignore:starlette.middleware.wsgi is deprecated",
    }
    return cmd, env


__all__ = [  # this module's names and the store upkeep's public ones
    "ui_command",
    "artifact_text",
    "artifact_paths",
    "runs_named",
    "run_by_id",
    "experiment_runs",
    "experiment_names",
    "find_experiment",
    "set_tags",
    "EXPERIMENT_TAGS",
    "SERVER_PROBE_S",
    "SQLITE_BUSY_TIMEOUT",
    "TRACKING_URI_FORMS",
    "check_server",
    "check_store",
    "check_tracking_uri",
    "client",
    "experiment_id",
    "finish_run",
    "has_figures",
    "local_store",
    "log_figure",
    "log_metrics",
    "log_run",
    "log_text",
    "logged_steps",
    "name_run",
    "open_run",
    "prompt_name",
    "register_prompt",
    "registered_prompts",
    "render_prompts",
    "require_store",
    "set_best",
    "split_prompts",
    "store_errors",
]
