"""Reading and writing data.json files.

Text -> checked `UserItem`s with every problem reported by JSON path (never a traceback), and items
-> the published JSON, written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from memloop.core.files import atomic_write_text, not_a_file
from memloop.environment.data import UserItem
from memloop.environment.errors import EnvFileError
from memloop.environment.paths import FILE_PATH, ROOT_PATH, from_loc
from memloop.environment.validation import check_items

_TYPE_MESSAGES = {
    "missing": "missing required field",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "list_type": "expected a list",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "bool_type": "expected true or false",
    "none_required": "expected null",
}


def _describe_value(value: Any) -> str:
    """A short JSON-flavoured description of an input value, for 'got ...' messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _error_line(error: ErrorDetails, loc_prefix: tuple[int, ...], data: Any) -> str:
    path = from_loc(loc_prefix + tuple(error["loc"]), data)
    kind = error["type"]
    if kind == "missing":
        return f"{path}: {_TYPE_MESSAGES[kind]}"
    if kind in _TYPE_MESSAGES:
        return f"{path}: {_TYPE_MESSAGES[kind]}, got {_describe_value(error.get('input'))}"
    message = str(error.get("msg", kind))
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    value = error.get("input")
    got = "" if isinstance(value, (list, dict)) else f", got {_describe_value(value)}"
    return f"{path}: {message}{got}"


def parse_data(data: Any) -> tuple[list[UserItem], list[str]]:
    """Build items from decoded JSON.

    Returns the items that parsed and every violation (structural ones for items that did not parse,
    consistency ones for those that did).
    """
    if isinstance(data, dict):
        hint = "; wrap the single item in [ ]" if "periods" in data else ""
        return [], [f"{ROOT_PATH}: expected a list of user items, got an object{hint}"]
    if not isinstance(data, list):
        return [], [f"{ROOT_PATH}: expected a list of user items, got {_describe_value(data)}"]
    if not data:
        return [], [f"{ROOT_PATH}: the list holds no user items"]
    items: list[UserItem] = []
    problems: list[str] = []
    parsed_at: list[int] = []
    for i, raw in enumerate(data):
        try:
            items.append(UserItem.model_validate(raw))
            parsed_at.append(i)
        except ValidationError as exc:
            problems.extend(_error_line(err, (i,), data) for err in exc.errors())
    problems.extend(check_items(items, parsed_at))
    return items, problems


def parse_text(text: str) -> tuple[list[UserItem], list[str]]:
    """Decode JSON text and build items.

    An empty or malformed text gives one file-level violation.
    """
    if not text.strip():
        return [], [f"{FILE_PATH}: the file is empty"]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return [], [
            f"{FILE_PATH}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ]
    except RecursionError:
        return [], [f"{FILE_PATH}: JSON nested too deeply to read"]
    return parse_data(data)


def local_path(path: str | os.PathLike[str]) -> Path:
    """The local file a data path names.

    An ``hf://OWNER/NAME[@REV][/FILE]`` reference is found in (or fetched into) the Hugging Face
    cache by `memloop.environment.hf_data`; any other path is itself.
    """
    if isinstance(path, str) and path.startswith("hf://"):
        from memloop.environment.hf_data import data_file  # imports huggingface_hub: only if used

        return data_file(path)
    return Path(path)


def read_items(path: str | os.PathLike[str]) -> tuple[list[UserItem], list[str]]:
    """Read a data.json file (or an ``hf://`` reference): the items that parsed and every violation.

    Raises EnvFileError only when the file cannot be read at all.
    """
    path = local_path(path)
    if path.is_dir():
        raise EnvFileError(f"{path}: is a directory; give the path of a data.json file")
    if path.exists() and not path.is_file():  # a pipe would wait for a writer
        raise EnvFileError(f"{path}: {not_a_file(path)}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise EnvFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], [f"{FILE_PATH}: not UTF-8 text (byte {exc.start} cannot be decoded)"]
    return parse_text(text)


def load_items(path: str | os.PathLike[str]) -> list[UserItem]:
    """Load a data.json file (or an ``hf://`` reference), raising EnvFileError on any violation.

    The error is one line, naming the first problem.
    """
    items, problems = read_items(path)
    if problems:
        more = (
            f" (and {len(problems) - 1} more; list them with `memloop env validate {path}`)"
            if len(problems) > 1
            else ""
        )
        raise EnvFileError(f"{path}: {problems[0]}{more}", problems)
    return items


def dump_items(items: list[UserItem]) -> str:
    """The items as data.json text.

    Deterministic: field order, 2-space indent, UTF-8, final newline.
    """
    return json.dumps([item.to_json() for item in items], ensure_ascii=False, indent=2) + "\n"


def save_items(items: list[UserItem], path: str | os.PathLike[str]) -> None:
    """Write the items to `path` atomically.

    The items go to a temporary file in the same folder, then a rename, so a crash never leaves a
    half-written data file behind.
    """
    path = Path(path)
    if path.is_dir():
        raise EnvFileError(f"{path}: is a directory; give a file name such as {path / 'data.json'}")
    try:
        atomic_write_text(path, dump_items(items))
    except OSError as exc:
        raise EnvFileError(f"{path}: cannot write the file ({exc.strerror or exc})") from None
