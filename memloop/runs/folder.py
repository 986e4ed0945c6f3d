"""A run folder: one live process at a time; resumed only for the same run.

It is reset (`--force`) only when memloop can tell the files are its own.

`open_run_folder(folder, spec, ...)` is the one way a command takes a folder:
- a folder holding no spec.json and none of the run's files is new: spec.json is written;
- one holding the same spec (same key) is resumed: nothing is deleted;
- one holding another memloop run is refused in one line naming what changed, or with `force`
  its run files are deleted and it starts over;
- one holding run files beside no spec.json, or beside a spec.json memloop did not write, is
  refused in one line with or without `force`, and nothing is deleted.
The check is made before anything is written and again once the folder's lock is held. A run
that fails before writing anything but spec.json (an unreachable endpoint, a policy that cannot
be built) leaves the folder as it found it: its spec.json is removed, and so are the folder and
its parents when this run made them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from memloop.core.errors import UserError
from memloop.core.files import LOCK_FILE, atomic_write_json, run_folder_lock
from memloop.runs.manifest import MANIFEST_FILE, write_manifest
from memloop.runs.spec import RunSpec

SPEC_FILE = "spec.json"


def read_spec(folder: Path, option: str = "--out") -> RunSpec | None:
    """The RunSpec a memloop run recorded in `folder`, None when it has no spec.json.

    A spec.json memloop did not write (unreadable, not JSON, another structure) is refused in
    one line: the folder is not memloop's to resume or to delete.
    """
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problem = f"{SPEC_FILE} is unreadable: {exc}"
    else:
        spec = RunSpec.from_document(data)
        if spec is not None:
            return spec
        problem = f"{SPEC_FILE} is not a memloop run spec"
    raise UserError(
        f"{option} {folder}: holds files memloop did not write ({problem}); "
        f"choose another {option} or remove them yourself"
    )


def check_run_folder(
    folder: Path, spec: RunSpec, *, run_files: Iterable[str], force: bool, option: str = "--out"
) -> bool:
    """Whether `folder` must be reset (force on another memloop run); refuses what it must."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{option} {folder}: is a file, not a folder")
    before = read_spec(folder, option)
    if before is None:
        if any((folder / name).exists() for name in run_files):
            raise UserError(
                f"{option} {folder}: holds files memloop did not write (no {SPEC_FILE}); "
                f"choose another {option} or remove them yourself"
            )
        return False
    if before.key() == spec.key():
        return force
    if not force:
        raise UserError(
            f"{option} {folder}: holds a run with other settings (changed: "
            f"{', '.join(before.differences(spec))}); choose another {option}, or --force to "
            "start over there"
        )
    return True


@contextlib.contextmanager
def open_run_folder(
    folder: Path,
    spec: RunSpec,
    command: str,
    *,
    run_files: Iterable[str] = (),
    force: bool = False,
    option: str = "--out",
) -> Iterator[Path]:
    """Hold `folder` for `spec`'s run (see the module doc); yields the folder."""
    folder = Path(folder)
    run_files = (*run_files, SPEC_FILE, MANIFEST_FILE)
    check_run_folder(folder, spec, run_files=run_files, force=force, option=option)
    made = _first_missing(folder)  # the outermost folder the lock will make, if any
    lock = contextlib.ExitStack()
    try:
        lock.enter_context(run_folder_lock(folder, command))
    except OSError as exc:
        raise UserError(f"{option} {folder}: cannot write there ({exc.strerror})") from None
    with lock:  # a second live process in this folder is refused until this one ends
        fresh: set[str] | None = None  # what the folder held when a run started afresh there
        try:
            if check_run_folder(folder, spec, run_files=run_files, force=force, option=option):
                delete_run_files(folder, run_files)
            held = set(os.listdir(folder))
            if SPEC_FILE not in held:
                fresh = held
            atomic_write_json(folder / SPEC_FILE, spec.document(), indent=2)
            write_manifest(folder, spec)  # the command line that makes the run again
            yield folder
        except BaseException:
            _leave_as_found(folder, fresh, made)
            raise


def _first_missing(folder: Path) -> Path | None:
    """The outermost of `folder` and its parents that does not exist (None: it exists)."""
    missing = None
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


def _leave_as_found(folder: Path, fresh: set[str] | None, made: Path | None) -> None:
    """Undo a fresh run's spec.json, and the folders it made, when it wrote nothing else.

    A resumed run, or one that wrote any file of its own, is left alone: that is work to resume.
    """
    try:
        if fresh is not None and set(os.listdir(folder)) <= fresh | {
            SPEC_FILE,
            LOCK_FILE,
            MANIFEST_FILE,
        }:
            (folder / SPEC_FILE).unlink(missing_ok=True)
            (folder / MANIFEST_FILE).unlink(missing_ok=True)
        if made is None or set(os.listdir(folder)) - {LOCK_FILE}:
            return
        (folder / LOCK_FILE).unlink(missing_ok=True)
        for empty in (folder, *folder.parents):
            empty.rmdir()  # OSError when not empty: someone else's files, left alone
            if empty == made:
                break
    except OSError:  # the failure that brought us here is the one to report
        pass


def delete_run_files(folder: Path, names: Iterable[str]) -> None:
    """The named run files of `folder` (nothing else the folder holds)."""
    for name in names:
        target = folder / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
