"""Environment data on the Hugging Face Hub: ``hf://OWNER/NAME[@REVISION][/FILE]``.

The published AMemGym data is the dataset ``AGI-Eval/AMemGym``. Its card declares one config with
one split, ``v1.base`` (the paper's data), stored as ``v1.base/data.json``; a bare name means that
file. FILE is a path in the dataset ending in ``.json``, or a folder (a config such as
``v1.base``) holding a ``data.json``. A revision (branch, tag or commit) holding ``/`` is written
with ``%2F``.

Files live in huggingface_hub's standard cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, read at
call time). With ``HF_HUB_OFFLINE=1``, which memloop sets unless the user sets it, only the cache is
read; otherwise a missing or outdated file is downloaded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.constants import ENV_VARS_TRUE_VALUES
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from memloop.core.settings import quiet_logger
from memloop.environment.errors import EnvFileError

PREFIX = "hf://"
DATA_FILE = "data.json"
DEFAULT_FILE = "v1.base/data.json"
"""The file a bare dataset name means: the published data's only split (v1.base, the paper's)."""

_NAME_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_USAGE = "write hf://OWNER/NAME[@REVISION][/FILE.json], e.g. hf://AGI-Eval/AMemGym"


@dataclass(frozen=True)
class HfRef:
    """A dataset on the Hub, an optional revision and an optional file in it."""

    repo_id: str
    revision: str | None = None  # None: the Hub's default branch (main)
    filename: str | None = None  # None: DEFAULT_FILE when loading, every data.json when pulling

    @property
    def file(self) -> str:
        """The file to load."""
        return self.filename or DEFAULT_FILE

    def spec(self, filename: str | None = None) -> str:
        """``OWNER/NAME[@REV][/FILE]``, as `memloop env pull` takes it (FILE omitted if default)."""
        filename = filename if filename is not None else self.filename
        rev = f"@{self.revision.replace('/', '%2F')}" if self.revision else ""
        path = f"/{filename}" if filename and filename != DEFAULT_FILE else ""
        return f"{self.repo_id}{rev}{path}"

    def uri(self, filename: str | None = None) -> str:
        """The ``hf://`` reference for ``--env``."""
        return PREFIX + self.spec(filename)


def is_hf_ref(path: object) -> bool:
    """Whether a data path names a file on the Hugging Face Hub."""
    return isinstance(path, str) and path.startswith(PREFIX)


def parse_ref(name: str) -> HfRef:
    """Parse ``[hf://][datasets/]OWNER/NAME[@REVISION][/FILE]``; a bad name is one EnvFileError."""
    text = name.strip()
    body = text[len(PREFIX) :] if text.startswith(PREFIX) else text
    if body.startswith("datasets/"):  # huggingface_hub's own hf:// URLs name the repo type
        body = body[len("datasets/") :]
    parts = body.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise EnvFileError(f"{name}: not a Hugging Face dataset name; {_USAGE}")
    owner, repo = parts[0], parts[1]
    revision: str | None = None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
        revision = unquote(revision)
        if not revision:
            raise EnvFileError(f"{name}: empty revision after '@'; {_USAGE}")
    for part in (owner, repo):
        if not _NAME_PART.fullmatch(part) or "--" in part or ".." in part:
            raise EnvFileError(f"{name}: {part!r} is not a valid Hugging Face name; {_USAGE}")
    rest = [p for p in parts[2:] if p]
    if any(p in (".", "..") for p in rest):
        raise EnvFileError(f"{name}: the file path may not contain '.' or '..'; {_USAGE}")
    filename = "/".join(rest) or None
    if filename and not filename.endswith(".json"):
        filename = f"{filename}/{DATA_FILE}"  # a config folder such as v1.base
    return HfRef(f"{owner}/{repo}", revision, filename)


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder, from the environment as it is now.

    huggingface_hub reads these variables once, when imported; reading them here keeps a later
    change (a test, a wrapper script) effective.
    """
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (else TRANSFORMERS_OFFLINE) forbids downloads, as the hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ENV_VARS_TRUE_VALUES


def _fetch(name: str, ref: HfRef, filename: str | None) -> Path:
    """One file of the dataset, or (no filename) the snapshot folder of all its data.json files.

    From the cache, or the Hub unless offline; a failure is one EnvFileError naming the dataset.
    """
    try:
        # huggingface_hub's retry warnings: a failure ends as one line of ours instead
        with quiet_logger("huggingface_hub"):
            if filename:
                return Path(
                    str(
                        hf_hub_download(
                            ref.repo_id,
                            filename,
                            repo_type="dataset",
                            revision=ref.revision,
                            cache_dir=hub_cache_dir(),
                            local_files_only=hub_offline(),
                        )
                    )
                )
            return Path(
                snapshot_download(
                    ref.repo_id,
                    repo_type="dataset",
                    revision=ref.revision,
                    cache_dir=hub_cache_dir(),
                    allow_patterns=[DATA_FILE, f"*/{DATA_FILE}"],
                    local_files_only=hub_offline(),
                )
            )
    except Exception as exc:
        error = _user_error(name, ref, exc, filename or f"{DATA_FILE} files")
        if error is None:
            raise
        raise error from None


def data_file(name: str) -> Path:
    """The local copy of the data file an ``hf://`` reference names, from the cache or the Hub."""
    ref = parse_ref(name)
    return _fetch(name, ref, ref.file)


@dataclass(frozen=True)
class Pulled:
    """What `pull` found: the commit and the data files, as (path in the dataset, local path)."""

    ref: HfRef
    commit: str
    files: list[tuple[str, Path]]


def pull(name: str) -> Pulled:
    """Download the dataset's data files into the cache, or find them there.

    A name with a file fetches that file; a bare name fetches every ``data.json`` in the dataset.
    """
    ref = parse_ref(name)
    offline = hub_offline()
    if ref.filename:
        local = _fetch(name, ref, ref.filename)
        snapshot = local.parents[len(ref.filename.split("/")) - 1]
        files = [(ref.filename, local)]
    else:
        snapshot = _fetch(name, ref, None)
        found = sorted(p for p in snapshot.rglob(DATA_FILE) if p.is_file())
        files = [(p.relative_to(snapshot).as_posix(), p) for p in found]
    if not files:
        where = "its cached copy holds" if offline else "it holds"
        raise EnvFileError(
            f"{name}: dataset {ref.repo_id} was found but {where} no {DATA_FILE}; name the file "
            f"as hf://{ref.repo_id}/PATH/FILE.json"
            + (f", or run `HF_HUB_OFFLINE=0 memloop env pull {ref.spec()}`" if offline else "")
        )
    return Pulled(ref, snapshot.name, files)


def _user_error(name: str, ref: HfRef, exc: Exception, wanted: str) -> EnvFileError | None:
    """A huggingface_hub failure as one line naming the dataset and what to do.

    None for anything unexpected: that is a bug, and keeps its traceback.
    """
    what = f"dataset {ref.repo_id} ({wanted}"
    what += f", revision {ref.revision})" if ref.revision else ")"
    if isinstance(exc, LocalEntryNotFoundError):
        why = (
            "HF_HUB_OFFLINE=1 forbids downloading (memloop sets it unless you do)"
            if hub_offline()
            else "the Hugging Face Hub cannot be reached"
            + (f" ({type(exc.__cause__).__name__})" if exc.__cause__ else "")
        )
        return EnvFileError(
            f"{name}: {what} is not in the Hugging Face cache {hub_cache_dir()} and {why}; run "
            f"`HF_HUB_OFFLINE=0 memloop env pull {ref.spec()}` on a machine with network (then "
            "copy its cache folder here or point HF_HUB_CACHE at it), or pass a local data.json"
        )
    if isinstance(exc, GatedRepoError):
        return EnvFileError(
            f"{name}: dataset {ref.repo_id} is gated; accept its terms on huggingface.co and log "
            "in with `hf auth login`, or pass a local data.json"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return EnvFileError(
            f"{name}: no dataset {ref.repo_id} on the Hugging Face Hub (if it is private, log in "
            "with `hf auth login`); the published data is hf://AGI-Eval/AMemGym"
        )
    if isinstance(exc, RevisionNotFoundError):
        return EnvFileError(
            f"{name}: dataset {ref.repo_id} has no revision {ref.revision!r}; give a branch, tag "
            "or commit hash after '@'"
        )
    if isinstance(exc, EntryNotFoundError):
        return EnvFileError(
            f"{name}: dataset {ref.repo_id} has no file {ref.file}; the published data is "
            f"{DEFAULT_FILE} (hf://{ref.repo_id})"
        )
    if isinstance(exc, HfHubHTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return EnvFileError(
            f"{name}: the Hugging Face Hub refused the download ({first}); try again later, or "
            "pass a local data.json"
        )
    if isinstance(exc, OSError):
        return EnvFileError(
            f"{name}: cannot use the Hugging Face cache {hub_cache_dir()} "
            f"({exc.strerror or exc}); free space or set HF_HUB_CACHE to a writable folder"
        )
    return None
