"""`memloop export`: an evolve run's prompts in the forms people deploy.

The run is a run folder (``runs/<experiment>/<condition>``, the one evolve wrote) or an MLflow
run (name or id) read through MLflow's client, so a tracking server works like a local store.
The cycle is the one selected on validation users (compare's rule, `select_cycle`) unless
``--cycle`` names another.

Formats:
- ``text``: each prompt under a ``=== name ===`` line, after ``#`` lines saying where it came from;
- ``mem0``: a JSON config ``mem0.Memory.from_config`` builds offline (AWE runs only): both
  prompts as ``custom_fact_extraction_prompt`` / ``custom_update_memory_prompt``, and the run's
  embedder, vector store, graph store and LLM endpoint (`mem0_config`);
- ``dspy``: the policy's DSPy program (``AWIProgram``/``AWEProgram``) saved with DSPy's ``save``;
  ``program.load(path)`` restores it.

Every format but dspy's (whose file DSPy's ``load`` reads whole) records the run, cycle, rule,
validation score and commit; dspy's program is written beside a ``.source.json`` that does.

``--out`` replaces only an earlier export nobody changed since: each format records the sha256
of what it wrote (the text's ``# sha256 of the prompts below`` line, the mem0 config's
``memloop_source.content_sha256``, the ``.source.json``'s ``content_sha256`` of the DSPy program),
so a file memloop did not write, or an export edited since (a mem0 config with your llm merged
in), is refused in one line, and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memloop.core import interrupt
from memloop.core.credentials import DEFAULT_KEY_ENV, OPENAI_HOST
from memloop.core.errors import UserError
from memloop.core.files import (
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    json_sha256,
    refuse_foreign_file,
)
from memloop.feedback.objective import LEGACY_OBJECTIVE
from memloop.policies.config import SETTINGS_KEY
from memloop.policies.prompt_files import MEM0_KEYS
from memloop.policies.prompt_files import render_text as render_prompt_text
from memloop.runs.cycles import Confirmation, CycleRecord, load_confirmation, select_cycle

FORMATS = ("text", "mem0", "dspy")


@dataclass
class Exported:
    """The prompts of one cycle of one run, and where they came from."""

    run: str  # the run folder or MLflow run name, as the user named it
    run_id: str | None  # the MLflow run id (None for a folder)
    policy: str  # the policy type (awi, awe, ...)
    cycle: int
    rule: str  # why this cycle: the selection's rule (the seed unless improved), or "--cycle N"
    objective: str | None
    val_objective: float | None
    test_objective: float | None
    commit: str | None
    prompts: dict[str, str]
    policy_config: dict[str, Any] | None = None  # the run's policy YAML (its spec)
    agent: dict[str, Any] | None = None  # the run's agent endpoint (model, base_url, ...)
    check: dict[str, Any] | None = None  # `memloop export --check`'s record (export_check.py)

    def source(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("prompts", "policy_config", "agent"):
            out.pop(key)
        return out


def _pick(
    records: list[CycleRecord],
    objective: str | None,
    cycle: int | None,
    run: str,
    confirmation: Confirmation | None = None,
):
    if not records:
        raise UserError(f"{run}: the run has no finished cycle yet; nothing to export")
    if cycle is not None:
        known = [r.cycle for r in records]
        if cycle not in known:
            raise UserError(f"--cycle {cycle}: {run} has finished cycles {known[0]}-{known[-1]}")
        return cycle, f"--cycle {cycle}"
    selection = select_cycle(records, objective or LEGACY_OBJECTIVE, confirmation)
    assert selection is not None  # records is not empty
    return selection.cycle, selection.rule


def _scores(record: CycleRecord, objective: str | None) -> tuple[float | None, float | None]:
    metric = objective or LEGACY_OBJECTIVE
    return record.score("val", metric), record.score("test", metric)


def from_folder(folder: Path, cycle: int | None) -> Exported:
    from memloop.runs.folder import SPEC_FILE, read_spec
    from memloop.runs.store import CycleStore

    spec = read_spec(folder, option="RUN")
    if spec is None:
        raise UserError(f"{folder}: no {SPEC_FILE}; not an evolve run folder")
    if spec.kind != "evolve":
        raise UserError(f"{folder}: a {spec.kind} run; export reads evolve runs")
    store = CycleStore(folder)
    records: list[CycleRecord] = []
    while (record := store.record(len(records))) is not None:
        records.append(record)
        interrupt.check()  # Ctrl-C stops here even when its KeyboardInterrupt was swallowed
    k, rule = _pick(records, spec.objective, cycle, str(folder), load_confirmation(folder))
    prompts = store.saved_prompts(k)
    if prompts is None:
        raise UserError(f"{folder}: cycle {k} recorded no prompts")
    val, test = _scores(records[k], spec.objective)
    document = json.loads((folder / SPEC_FILE).read_text())
    return Exported(
        run=str(folder),
        run_id=None,
        policy=str(spec.policy.get("type")),
        cycle=k,
        rule=rule,
        objective=spec.objective,
        val_objective=val,
        test_objective=test,
        commit=document.get("git_revision"),
        prompts=prompts,
        policy_config=dict(spec.policy),
        agent=dict(spec.endpoints.get("agent", {})),
    )


def _find_run(mlc, name: str, tracking_uri: str):
    """The MLflow run with id or name `name`, over every experiment; one line when not one."""
    from memloop.runs import tracker

    if re.fullmatch(r"[0-9a-f]{32}", name):
        run = tracker.run_by_id(mlc, name)
        if run is not None:
            return run
    runs = [r for r in tracker.runs_named(mlc, name) if r.data.tags.get("memloop.kind") == "evolve"]
    if not runs:
        raise UserError(
            f"RUN {name!r}: no run folder or evolve run of that name or id in {tracking_uri}"
        )
    if len(runs) > 1:
        ids = ", ".join(r.info.run_id for r in runs[:5])
        raise UserError(f"RUN {name!r}: {len(runs)} evolve runs have that name ({ids}); give an id")
    return runs[0]


def from_mlflow(name: str, tracking_uri: str, cycle: int | None) -> Exported:
    from memloop.results.rows import logged_prompts, run_confirmation, run_records
    from memloop.runs import tracker
    from memloop.runs.spec import spec_from_params

    mlc = tracker.client(tracking_uri, create=False)
    with tracker.store_errors(tracking_uri):
        run = _find_run(mlc, name, tracking_uri)
        records = run_records(mlc, run.info.run_id)
        objective = run.data.tags.get("memloop.objective")
        confirmation = run_confirmation(mlc, run.info.run_id)
        k, rule = _pick(records, objective, cycle, name, confirmation)
        prompts = logged_prompts(mlc, run.info.run_id, k)
    val, test = _scores(records[k], objective)
    spec = spec_from_params(run.data.params)
    return Exported(
        run=name,
        run_id=run.info.run_id,
        policy=str(spec.get("policy.type")),
        cycle=k,
        rule=rule,
        objective=objective,
        val_objective=val,
        test_objective=test,
        commit=run.data.tags.get("mlflow.source.git.commit"),
        prompts=prompts,
        policy_config=_unflatten(spec, "policy."),
        agent=_unflatten(spec, "endpoints.agent."),
    )


def _unflatten(flat: dict[str, str], prefix: str) -> dict[str, Any]:
    """The nested mapping of the `prefix`ed params (values as JSON where they parse)."""
    out: dict[str, Any] = {}
    for key, text in flat.items():
        if not key.startswith(prefix):
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *parents, leaf = key[len(prefix) :].split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def load_exported(run: str, tracking_uri: str, cycle: int | None = None) -> Exported:
    folder = Path(run)
    if folder.is_dir():
        return from_folder(folder, cycle)
    return from_mlflow(run, tracking_uri, cycle)


def _header(exported: Exported) -> list[str]:
    def num(x: float | None) -> str:
        return "undefined" if x is None else f"{x:.3f}"

    metric = exported.objective or LEGACY_OBJECTIVE
    return [
        f"# memloop export of run {exported.run}"
        + (f" (MLflow run {exported.run_id})" if exported.run_id else ""),
        f"# policy {exported.policy}, cycle {exported.cycle} ({exported.rule})",
        f"# {metric}: validation {num(exported.val_objective)}, "
        f"test {num(exported.test_objective)}",
        f"# commit {exported.commit or 'unknown'}",
        *([f"# export check: {exported.check['summary']}"] if exported.check else []),
    ]


TEXT_MARK = "# memloop export of run "
DIGEST_LINE = "# sha256 of the prompts below: "
DIGEST_KEY = "content_sha256"  # in a mem0 config's memloop_source and a DSPy .source.json
_SOURCE_KEYS = {"run", "run_id", "policy", "cycle", "rule", DIGEST_KEY}


def _split_header(text: str) -> tuple[list[str], str]:
    """A text export's leading ``#`` lines, and the rest (which is what its digest covers)."""
    lines = text.split("\n")
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    return lines[:n], "\n".join(lines[n:])


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def render_text(exported: Exported) -> str:
    """The text format: the source lines, the prompts' sha256, then one section per prompt."""
    header, body = _split_header(render_prompt_text(exported.prompts, _header(exported)))
    return "\n".join([*header, f"{DIGEST_LINE}{_sha256(body)}"]) + "\n" + body


def _small_json(path: Path, limit: int = 8 << 20) -> Any:
    """The JSON document of `path` (None when missing, larger than `limit` bytes or not JSON)."""
    if not path.is_file() or path.stat().st_size > limit:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _source_of(path: Path) -> Path:
    """The ``.source.json`` written beside a DSPy program."""
    return path.with_name(f"{path.stem}.source.json")


def _is_source(value: Any) -> bool:
    return isinstance(value, dict) and _SOURCE_KEYS <= set(value)


def is_export(path: Path) -> bool:
    """Whether `path` is an export memloop wrote, unchanged since (its recorded sha256 holds)."""
    with open(path, "rb") as handle:
        text_export = handle.read(len(TEXT_MARK)) == TEXT_MARK.encode()
    if text_export:
        header, body = _split_header(path.read_text(encoding="utf-8"))
        digests = [line[len(DIGEST_LINE) :] for line in header if line.startswith(DIGEST_LINE)]
        return digests == [_sha256(body)]
    document = _small_json(path)
    if isinstance(document, dict) and _is_source(document.get("memloop_source")):
        source = dict(document["memloop_source"])
        recorded = source.pop(DIGEST_KEY)
        return recorded == json_sha256({**document, "memloop_source": source})
    source = _small_json(_source_of(path))
    return _is_source(source) and source[DIGEST_KEY] == file_sha256(path)


def _is_source_file(path: Path) -> bool:
    """Whether `path` is a DSPy export's ``.source.json`` (memloop's fields, nothing else)."""
    document = _small_json(path)
    fields = _SOURCE_KEYS | set(Exported.__annotations__) | DSPY_SOURCE_KEYS
    return _is_source(document) and set(document) <= fields


EXPORT_MARK = "an export records the sha256 of what it wrote"
DSPY_SOURCE_KEYS = {"module", "load"}  # a DSPy export's .source.json: the class, how to load it


def mem0_config(exported: Exported, key_env: str | None = None) -> dict[str, Any]:
    """mem0's MemoryConfig of the run: both prompts, and the embedder, stores and LLM it used.

    `mem0.Memory.from_config` builds it offline: the embedder is the run's sentence-transformers
    model as a local folder, the vector store the run's (the default in-process Qdrant as a
    local Qdrant folder, `mem0-vector-store`), its graph store (mem0's in-memory Kùzu), the LLM
    the run's agent model at its endpoint, its key never written (`mem0_api_key`: left to mem0's
    OPENAI_API_KEY only for OpenAI's own host; `key_env`, the variable holding another host's
    key, named in a placeholder to replace). A part that cannot be written without a credential is
    refused in one line. `memloop_source` says where it came from (mem0 ignores it).
    """
    missing = [name for name in MEM0_KEYS if name not in exported.prompts]
    if missing:
        raise UserError(
            f"--format mem0: run {exported.run}'s policy {exported.policy!r} has prompts "
            f"({', '.join(exported.prompts) or 'none'}), not mem0's: a mem0 config comes from an "
            "AWE run (policy type: awe, which runs mem0); for this run use --format text or dspy"
        )
    out: dict[str, Any] = {"version": "v1.1"}
    for name, key in MEM0_KEYS.items():
        out[key] = exported.prompts[name]
    out.update(_mem0_parts(exported, key_env))
    out["memloop_source"] = exported.source()
    # the sha256 of the config without it: an edited config (your llm merged in) is not replaced
    out["memloop_source"][DIGEST_KEY] = json_sha256(out)
    return out


MEM0_2X_LOST = (
    "the evolved memory_update prompt: mem0 2.x adds what it extracts, without 1.x's second "
    "step that reconciles new facts with stored ones (ADD / UPDATE / DELETE), and has no "
    "setting for that prompt; its own extraction prompt stays, with the evolved fact_extraction "
    "prompt inserted as custom_instructions; the graph store (2.x's config has none)"
)


def mem0_2x_config(config: dict[str, Any]) -> dict[str, Any]:
    """What mem0 2.x can take of `mem0_config`'s 1.x config.

    2.x replaced the two-step pipeline AWE follows (extract, then reconcile) with an additive
    extraction whose system prompt cannot be replaced (mem0 #4805): it takes the evolved
    extraction prompt as `custom_instructions` only. What is lost is recorded in
    `memloop_source.mem0_2x_lost` (`MEM0_2X_LOST`).
    """
    out = {
        k: v
        for k, v in config.items()
        if k not in {*MEM0_KEYS.values(), "graph_store", "memloop_source"}
    }
    out["custom_instructions"] = config[MEM0_KEYS["fact_extraction"]]
    # the check ran the 1.x config: the 2.x file records none
    source = {k: v for k, v in config["memloop_source"].items() if k not in (DIGEST_KEY, "check")}
    out["memloop_source"] = {**source, "mem0_2x_lost": MEM0_2X_LOST}
    out["memloop_source"][DIGEST_KEY] = json_sha256(out)
    return out


def mem0_2x_path(out: Path) -> Path:
    """Where the mem0 2.x config is written beside `--out` (mem0_config.json: .2x.json)."""
    return out.with_name(f"{out.stem}.2x{out.suffix or '.json'}")


MEM0_STORE_FOLDER = "mem0-vector-store"  # a local store's folder, relative to where mem0 runs


def _mem0_parts(exported: Exported, key_env: str | None) -> dict[str, Any]:
    """The embedder, vector store, graph store, LLM and history file of the run, for mem0."""
    from memloop.policies.config import PACKAGED_EMBEDDER
    from memloop.policies.embedder import resolve_embedding_model
    from memloop.policies.mem0_options import (
        COLLECTION,
        mem0_graph_store,
        mem0_vector_store,
        secret_keys,
    )

    policy = exported.policy_config or {}
    folder = resolve_embedding_model(policy.get("embedding_model") or PACKAGED_EMBEDDER)
    dims = embedding_dims(folder)
    option = policy.get("vector_store")
    if option is None:  # memloop's default: an in-process Qdrant, here kept in a folder
        store: dict[str, Any] = {
            "provider": "qdrant",
            "config": {
                "collection_name": COLLECTION,
                "embedding_model_dims": dims,
                "path": MEM0_STORE_FOLDER,
            },
        }
    else:
        secrets = secret_keys(option)
        if secrets:
            raise UserError(
                f"--format mem0: the run's vector_store ({option['provider']}) reads "
                f"{', '.join(secrets)} from the environment at run time, and an export writes no "
                "credential; export --format text and give mem0 that store yourself"
            )
        store = mem0_vector_store(option, dims=dims, folder=Path(MEM0_STORE_FOLDER), kind="awe")
    parts: dict[str, Any] = {
        "embedder": {
            "provider": "huggingface",
            "config": {"model": str(folder), "embedding_dims": dims},
        },
        "vector_store": store,
        "llm": _mem0_llm(exported.agent or {}, key_env),
        "history_db_path": "mem0-history.sqlite",
    }
    graph = policy.get("graph_store")
    if graph is not None:
        parts["graph_store"] = mem0_graph_store(graph)
    return parts


def _mem0_llm(agent: dict[str, Any], key_env: str | None) -> dict[str, Any]:
    """mem0's OpenAI-compatible LLM at the run's agent endpoint (its key: `mem0_api_key`)."""
    from urllib.parse import urlparse

    from memloop.llm.endpoint import LOCAL

    base_url = agent.get("base_url")
    if not base_url or base_url == LOCAL:
        raise UserError(
            "--format mem0: the run's agent was memloop's embedded model, which has no fixed "
            "address for mem0 to call; export --format text (or run the policy on a served "
            "endpoint) and give mem0 your llm"
        )
    config: dict[str, Any] = {"model": agent.get("model"), "openai_base_url": base_url}
    for key in ("temperature", "max_tokens"):
        if agent.get(key) is not None:
            config[key] = agent[key]
    config["api_key"] = mem0_api_key(urlparse(base_url).hostname or "", key_env)
    if config["api_key"] is None:
        del config["api_key"]
    return {"provider": "openai", "config": config}


NO_KEY = "not-needed"  # what a server that takes no key is given: no credential


def mem0_api_key(host: str, key_env: str | None) -> str | None:
    """The `api_key` a mem0 config gets for an LLM at `host`: never a credential.

    mem0's OpenAI LLM sends $OPENAI_API_KEY to whatever host its config names when the config
    holds no key. So the key is left out only for OpenAI's own host with OPENAI_API_KEY (or no
    variable named); a key variable named for another host is written as a placeholder naming it
    (`key_placeholder`: a request fails until it is replaced, and sends no key of the user's);
    with none named, a loopback or other server is given `NO_KEY`, as memloop sent it none.
    """
    if host.lower() == OPENAI_HOST and key_env in (None, DEFAULT_KEY_ENV):
        return None
    return key_placeholder(key_env) if key_env else NO_KEY


def key_placeholder(key_env: str) -> str:
    """The text a mem0 config holds where the value of `key_env` goes."""
    return f"<replace with the value of ${key_env}>"


def embedding_dims(folder: Path) -> int:
    """The vector size of a sentence-transformers folder, read without loading the model.

    Its pooling layer's size, else the model's hidden size.
    """
    sizes = (("1_Pooling/config.json", "word_embedding_dimension"), ("config.json", "hidden_size"))
    for name, key in sizes:
        path = folder / name
        if path.is_file():
            value = json.loads(path.read_text()).get(key)
            if isinstance(value, int):
                return value
    raise UserError(
        f"{folder}: no vector size in its config files (not a sentence-transformers folder?)"
    )


def dspy_program(exported: Exported):
    from memloop.policies.programs import AWEProgram, AWIProgram

    programs = {"awi": AWIProgram, "awe": AWEProgram}
    cls = programs.get(exported.policy)
    names = {"awi": {"writer"}, "awe": set(MEM0_KEYS)}.get(exported.policy)
    if cls is None or names != set(exported.prompts):
        raise UserError(
            f"--format dspy: run {exported.run}'s policy {exported.policy!r} has no DSPy program "
            f"in memloop (programs: {', '.join(programs)}); use --format text"
        )
    return cls(**exported.prompts)


def write_export(exported: Exported, fmt: str, out: Path, key_env: str | None = None) -> list[Path]:
    """Write `exported` as `fmt` to `out`; the files written (`key_env`: `mem0_config`'s)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    if out.is_dir():
        raise UserError(f"--out {out}: is a folder; give a file name")
    if not (fmt == "dspy" and _interrupted_export(out)):
        refuse_foreign_file(out, "--out", is_export, EXPORT_MARK)
        if fmt == "mem0":
            refuse_foreign_file(mem0_2x_path(out), "--out", is_export, EXPORT_MARK)
        if fmt == "dspy":
            refuse_foreign_file(_source_of(out), "--out", _is_source_file, EXPORT_MARK)
    if fmt != "text" and SETTINGS_KEY in exported.prompts:
        raise UserError(
            f"--format {fmt}: cycle {exported.cycle}'s prompts carry policy settings "
            f"({' '.join(exported.prompts[SETTINGS_KEY].split())}), which a "
            f"{'DSPy program' if fmt == 'dspy' else 'mem0 config'} cannot hold; --format text "
            "keeps them (a policy YAML's prompts_from: applies them)"
        )
    interrupt.check()  # the last moment to stop with nothing written
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "text":
        atomic_write_text(out, render_text(exported))
        return [out]
    if fmt == "mem0":
        config = mem0_config(exported, key_env)
        atomic_write_json(out, config, indent=2)
        atomic_write_json(mem0_2x_path(out), mem0_2x_config(config), indent=2)
        return [out, mem0_2x_path(out)]
    from memloop.policies.programs import save_program, save_whole_program

    if out.suffix != ".json":
        raise UserError(f"--out {out}: DSPy saves a program's state as .json; name a .json file")
    whole = _whole_program_dir(out)
    if whole.exists() and not (whole / "metadata.json").is_file():
        raise UserError(f"--out {out}: {whole} exists and is no DSPy program folder; not replaced")
    program = dspy_program(exported)
    interrupt.check()  # loading DSPy takes a second
    # its three parts are written in a staging folder beside `out`, then moved into place: a kill
    # while DSPy writes leaves the earlier export whole, one while they move leaves the staging
    # folder, by which the rerun knows the moved parts as its own (`_interrupted_export`)
    stage = _staging(out)
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    source = _source_of(out)
    save_program(program, stage / out.name)
    # the whole program too, for DSPy's own loader: dspy.load(DIR, allow_pickle=True)
    save_whole_program(program, stage / whole.name)
    module = f"{type(program).__module__}.{type(program).__qualname__}"
    atomic_write_json(
        stage / source.name,
        {
            **exported.source(),
            "module": module,
            "load": f"{type(program).__name__}().load({out.name!r}), or "
            f"dspy.load({whole.name!r}, allow_pickle=True)",
            DIGEST_KEY: file_sha256(stage / out.name),
        },
        indent=2,
    )
    if whole.exists():  # moved aside whole, then removed with the staging folder: a kill while
        whole.replace(stage / "replaced")  # removing it never leaves half a program folder
    (stage / whole.name).replace(whole)
    (stage / out.name).replace(out)
    (stage / source.name).replace(source)
    shutil.rmtree(stage)
    return [out, whole, source]


def _staging(out: Path) -> Path:
    """The folder a DSPy export to `out` is written in before its parts move into place."""
    return out.with_name(f".{out.stem}.export.tmp")


def _interrupted_export(out: Path) -> bool:
    """Whether a DSPy export to `out` was killed while its parts moved into place.

    Its staging folder is left, holding the `.source.json` of what it wrote; `out` is then that
    export's (or not there yet), and may be replaced though its own `.source.json` is the
    earlier one or missing.
    """
    stage = _staging(out)
    if not stage.is_dir():
        return False
    pending = _small_json(stage / _source_of(out).name)
    if not _is_source(pending):
        return False
    return not out.exists() or pending[DIGEST_KEY] == file_sha256(out)


def _whole_program_dir(out: Path) -> Path:
    """Where `dspy.load` finds the exported program: `<name>_program/` beside the state file.

    DSPy refuses a program folder whose name has a suffix, so the dots of a name such as
    `a.b.json`'s stem become underscores (`a_b_program/`).
    """
    return out.with_name(f"{out.stem.replace('.', '_')}_program")
