"""Atomic file writes, content hashes and file-system-safe names."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from memloop.core.errors import UserError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on a clean exit fsync it and rename it over ``path``.

    A crash or exception leaves either the old file or the new one, never half of one, and no
    temporary file behind. ``mode`` is ``"w"`` (UTF-8 text, Unix line ends) or ``"wb"``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    prefix = f".{target.name}.{os.getpid()}."  # the writer's pid: a killed one's is found stale
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)
    try:
        handle: IO[Any]
        if mode == "wb":
            handle = os.fdopen(fd, "wb")
        else:
            handle = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:  # a failed write (a full disk)
            raise OSError(exc.errno, exc.strerror, str(target)) from exc  # names the file
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(target: Path) -> None:
    """Remove the temporary files a killed writer of `target` left beside it.

    `atomic_writer`'s temporary names hold their writer's pid (`.NAME.PID.XXXX.tmp`); a kill -9
    skips its clean-up. One whose writer is no longer alive is removed; a live writer's is kept.
    """
    import glob

    # mkstemp's part is 8 characters of [a-z0-9_]: `.data.json.1234.x.tmp` is not `data`'s
    mine = re.compile(rf"\.{re.escape(target.name)}\.(\d{{1,10}})\.[a-z0-9_]{{8}}\.tmp")
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        found = mine.fullmatch(stale.name)
        if found and not _alive(int(found.group(1))) and stale.is_file():
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(text)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, "wb") as handle:
        handle.write(data)


def atomic_write_json(
    path: str | Path, value: Any, *, indent: int | None = 1, sort_keys: bool = False
) -> None:
    """Write ``value`` as UTF-8 JSON (non-ASCII kept, trailing newline) atomically."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)
    atomic_write_text(path, text + "\n")


def atomic_savefig(fig: Any, path: str | Path, **options: Any) -> Path:
    """Save the matplotlib figure ``fig`` to ``path`` atomically (see :func:`atomic_writer`).

    The format is the file's suffix (``.png``, ``.pdf``, ``.svg``, ...); ``options`` go to
    ``fig.savefig``. A kill or an error while matplotlib writes leaves the old file or none, never
    an empty or cut one. Returns ``path``.
    """
    target = Path(path)
    drawable_texts(fig)
    with atomic_writer(target, "wb") as handle:
        fig.savefig(handle, format=target.suffix.lstrip(".").lower() or None, **options)
    return target


MISSING_GLYPH = "\u25a1"  # □: drawn where the font has no glyph for a character


def drawable_texts(fig: Any) -> None:
    """Put MISSING_GLYPH where a text of `fig` has a character its font cannot draw.

    matplotlib's fonts (DejaVu Sans unless the user chose another) have no CJK, Arabic, ...
    glyphs: such a character (an experiment's name in a title) would be drawn as an empty box
    anyway, with a warning per character. The box is drawn here on purpose, without warnings.
    """
    from matplotlib.font_manager import findfont
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        content = text.get_text()
        if not content or content.isascii():
            continue
        glyphs = _charmap(findfont(text.get_fontproperties()))
        fixed = "".join(c if c.isspace() or ord(c) in glyphs else MISSING_GLYPH for c in content)
        if fixed != content:
            text.set_text(fixed)


@functools.lru_cache(maxsize=8)
def _charmap(font_file: str) -> frozenset[int]:
    """The code points `font_file` has glyphs for."""
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_file).get_charmap())


def read_user_text(path: str | Path) -> str:
    """A text file a user named, as UTF-8; a missing or unreadable one is a one-line UserError.

    A folder, and a pipe, socket or device (reading a pipe would wait for a writer), are said
    to be what they are.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {not_a_file(path)}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read the file ({exc})") from None


def not_a_file(path: Path) -> str:
    """What a path that is no regular file is: no such file, a folder, or a special file."""
    if path.is_dir():
        return "is a folder, not a file"
    if path.exists():  # a FIFO, a socket, a device
        return "is not a regular file (a pipe, socket or device); name a file"
    return "no such file"


def file_sha256(path: str | Path, chunk: int = 8 << 20) -> str:
    """The hex sha256 of a file's bytes, read in chunks (large model files stay out of memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def json_sha256(value: Any) -> str:
    """The hex sha256 of ``value`` as canonical JSON.

    Canonical: sorted keys, no spaces, UTF-8 kept as it is; values JSON cannot hold go through
    ``str``.
    """
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


MAX_NAME = 100  # characters of a name kept as it is


def safe_name(text: str) -> str:
    """A file or folder name for ``text`` that is distinct for distinct texts.

    A text made only of letters, digits, ``.``, ``_`` and ``-`` (and not ``.`` or ``..``) is kept
    as it is; any other text has its other characters replaced by ``_`` and a short hash of the
    original appended, so ``alice/1`` and ``alice_1`` never share a folder and ``..`` never
    escapes one. A text longer than ``MAX_NAME`` characters is cut the same way (a file name of
    more than 255 bytes cannot be created).
    """
    if text and len(text) <= MAX_NAME and not _UNSAFE.search(text) and text not in (".", ".."):
        return text
    cleaned = _UNSAFE.sub("_", text).strip(".") or "_"
    tag = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return f"{cleaned[:80]}-{tag}"


def sqlite_file(uri: str, *, create_folder: bool = True) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None; `create_folder`: make its folder."""
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///") :])
    if create_folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be opened as a sqlite database file, or None.

    A missing or empty file is fine (sqlite creates the database); a folder, an unreadable file or
    one that does not start with the sqlite header is not. Only the first 16 bytes are read.
    """
    path = Path(path)
    if path.is_dir():
        return "is a folder, not a database file"
    key = str(path.resolve())
    with _SQLITE_CHECKED_LOCK:
        # Read each file once per process, before this process connects to it: closing any
        # descriptor of a sqlite file releases the POSIX locks of every sqlite connection the
        # process holds on it, and a write under a lost lock corrupts the database.
        if key in _SQLITE_CHECKED:
            return None
        try:
            with open(path, "rb") as handle:
                head = handle.read(len(SQLITE_HEADER))
        except FileNotFoundError:
            head = b""
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        if head and head != SQLITE_HEADER:
            return "is not a sqlite database"
        _SQLITE_CHECKED.add(key)
        return None


_SQLITE_CHECKED: set[str] = set()  # files sqlite_problem found fine in this process
_SQLITE_CHECKED_LOCK = threading.Lock()


def store_lock(uri: str) -> contextlib.AbstractContextManager[Any]:
    """An inter-process lock beside a sqlite store (``<file>.lock``); a no-op for other URIs."""
    path = sqlite_file(uri)
    if path is None:
        return contextlib.nullcontext()
    return file_lock(f"{path}.lock", "the MLflow store's lock")


@contextlib.contextmanager
def file_lock(path: str | Path, what: str = "a lock") -> Iterator[None]:
    """An exclusive inter-process lock on the file `path` (flock) for the block.

    A wait longer than `LOCK_NOTICE_S` is said once on stderr, naming `what`, the file and the
    process holding it (`wait_for_flock`); Ctrl-C ends the wait.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wait_for_flock(fd, fcntl.LOCK_EX, path, what)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


LOCK_NOTICE_S = 2.0
"""Seconds a lock is waited for before the wait is said on stderr."""


def wait_for_flock(fd: int, operation: int, path: Path, what: str) -> None:
    """Take the flock `operation` (LOCK_EX / LOCK_SH) on `fd`, the open lock file `path`.

    Waits as long as the holder holds it (Ctrl-C ends the wait: `interrupt.Interrupted`). Past
    `LOCK_NOTICE_S` one line on stderr says what is waited for and who holds it (a hung holder
    no longer makes a command wait without a word). An exclusive holder writes its pid and
    command into the file for that line.
    """
    import fcntl
    import sys
    import time

    from memloop.core import interrupt

    started, said = time.monotonic(), False
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            pass
        if not said and time.monotonic() - started >= LOCK_NOTICE_S:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            print(
                f"memloop: waiting for {what} ({path}), held by {holder}; Ctrl-C stops",
                file=sys.stderr,
                flush=True,
            )
            said = True
        interrupt.sleep(0.05)
    if operation == fcntl.LOCK_EX:
        command = " ".join(os.path.basename(a) for a in sys.argv[:2]) or "python"
        with contextlib.suppress(OSError):  # the holder's name is a courtesy (a full disk)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"process {os.getpid()} ({command})".encode(), 0)


LOCK_FILE = ".memloop.lock"


@contextlib.contextmanager
def run_folder_lock(folder: str | Path, command: str) -> Iterator[None]:
    """Hold `folder` for this process while `command` works in it; refuse when another holds it.

    The lock is the kernel's (flock on `folder/.memloop.lock`): it dies with its process, so a
    lock left by a killed run is simply taken over. The holder's pid and command are written in
    the file for the one-line refusal.
    """
    import fcntl

    from memloop.core.errors import UserError

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"{folder}: in use by {holder}; wait for it to finish, or use another folder"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({command})")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def refuse_foreign_file(
    path: str | Path, option: str, ours: Callable[[Path], bool], mark: str
) -> None:
    """Refuse, in one line, to replace `path` when it exists and memloop cannot tell it wrote it.

    The rule of every file a command writes where the user says (`--out FILE`): an existing file
    is replaced only when `ours(path)` tells it is one memloop wrote and nobody changed since
    (`mark` says how, for the message); any other file stays as it is, and the command stops
    before writing anything (there is no `--force` for it: choose another name or remove it).
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()) or path.is_dir():
        return  # nothing in the way (a folder is each command's own one-line refusal)
    try:
        mine = ours(path)
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: not memloop's
        mine = False
    if not mine:
        raise UserError(
            f"{option} {path}: is a file memloop did not write, or one changed since ({mark}); "
            f"choose another {option} or remove it yourself"
        )
