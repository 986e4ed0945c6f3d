"""Persona records -> seeded selection -> the published `user_profile` fields.

Records are Nemotron-Personas-like rows from JSONL or parquet. List columns stored as text are
parsed as JSON or Python literals (never evaluated as code); unknown columns are ignored, missing
ones left out.
"""

from __future__ import annotations

import ast
import json
import math
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.environment.data import PROFILE_FIELD_ORDER, UserProfile

FREE_TEXT_COLUMNS = (
    "persona",
    "professional_persona",
    "sports_persona",
    "arts_persona",
    "travel_persona",
    "culinary_persona",
    "cultural_background",
    "career_goals_and_ambitions",
    "skills_and_expertise",
    "hobbies_and_interests",
)
"""Nemotron-Personas text columns that feed `complementary_info` (in this order)."""

MAX_DIRECT_SUMMARY_CHARS = 1200
"""Free text up to this length is used verbatim as `complementary_info`; longer text (or a
persona without a name) goes through the LLM profile step."""

_NAMESPACE = uuid.UUID("9b7f3c1e-52a4-4a8e-8f0c-6d1b2a3c4d5e")


@dataclass(frozen=True)
class Persona:
    """One row of a persona file, as a plain mapping of its non-empty columns."""

    row: dict[str, Any]

    @property
    def id(self) -> str:
        """The row's `uuid`, or a stable id derived from its content."""
        value = self.row.get("uuid") or self.row.get("id")
        if value:
            return str(value)
        text = json.dumps(self.row, sort_keys=True, ensure_ascii=False, default=str)
        return str(uuid.uuid5(_NAMESPACE, text))

    def free_text(self) -> str:
        parts = [
            str(self.row[col]).strip()
            for col in FREE_TEXT_COLUMNS
            if isinstance(self.row.get(col), str) and self.row[col].strip()
        ]
        return "\n".join(parts)

    def needs_llm_profile(self) -> bool:
        """True when a name must be extracted or the free text condensed by the LLM."""
        return not self.row.get("name") or len(self.free_text()) > MAX_DIRECT_SUMMARY_CHARS

    def basic_fields(self) -> dict[str, Any]:
        """The profile fields that come straight from columns (no LLM)."""
        row = self.row
        fields: dict[str, Any] = {"uuid": self.id}
        if row.get("name"):
            fields["name"] = str(row["name"]).strip()
        age = _as_int(row.get("age"))
        if age is not None:
            fields["age"] = age
        gender = row.get("sex") or row.get("gender")
        if gender:
            fields["gender"] = str(gender)
        for key in ("marital_status", "occupation"):
            if row.get(key):
                fields[key] = str(row[key])
        if row.get("education_level"):
            education = str(row["education_level"])
            if row.get("bachelors_field"):
                education += f" ({row['bachelors_field']})"
            fields["education_level"] = education
        for key in ("hobbies_and_interests", "skills_and_expertise"):
            items = parse_list(row.get(f"{key}_list"))
            fields[key] = ", ".join(items) if items else "N/A"
        return fields

    def profile(self, name: str | None = None, summary: str | None = None) -> UserProfile:
        """The published profile; `name` / `summary` come from the LLM step when it ran."""
        fields = self.basic_fields()
        if name:
            fields["name"] = name
        fields["complementary_info"] = summary if summary is not None else self.free_text()
        lines = [
            f"{key}: {fields[key]}" for key in PROFILE_FIELD_ORDER if fields.get(key) is not None
        ]
        return UserProfile(**fields, formatted_str="\n".join(lines))


def parse_list(value: Any) -> list[str]:
    """A list column as strings.

    Accepts a real list/array, JSON text, a Python list literal, or plain comma-separated text.
    Literals are parsed with `ast.literal_eval`, which evaluates no code.
    """
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()  # numpy / pyarrow arrays
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    if not isinstance(value, str):
        return []
    text = value.strip()
    if not text:
        return []
    if text.startswith("["):
        for parse in (json.loads, ast.literal_eval):
            try:
                parsed = parse(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(parsed, list):
                return [str(v).strip() for v in parsed if v is not None and str(v).strip()]
        text = text.strip("[]")
    return [part.strip().strip("'\"") for part in text.split(",") if part.strip().strip("'\"")]


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    try:
        return int(value)  # numpy integers
    except (TypeError, ValueError):
        return None


def _clean_row(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, str) and not value.strip():
            continue
        out[str(key)] = value
    return out


def load_personas(path: str | Path) -> list[Persona]:
    """Every persona in a `.jsonl` / `.json` (list) or `.parquet` file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such persona file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _read_parquet(path)
    elif suffix in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {n} is not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}: line {n} is not a JSON object")
            rows.append(row)
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise UserError(f"{path}: expected a JSON list of persona objects")
        rows = data
    else:
        raise UserError(
            f"{path}: unknown persona file type {suffix!r}; use .jsonl, .json or .parquet"
        )
    personas = [Persona(_clean_row(row)) for row in rows]
    if not personas:
        raise UserError(f"{path}: holds no personas")
    return personas


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise UserError(
            f"{path}: cannot read the parquet file ({str(exc).splitlines()[0][:200]})"
        ) from None
    return table.to_pylist()


def select_personas(
    personas: list[Persona],
    count: int,
    seed: int,
    exclude_ids: list[str] | tuple[str, ...] = (),
    source: str = "persona file",
) -> list[Persona]:
    """`count` personas in a seeded order.

    The order is a seeded shuffle of the whole pool, so asking for more users later keeps the
    earlier ones (a prefix) and their ids.
    """
    excluded = set(exclude_ids)
    seen: set[str] = set()
    pool = []
    for persona in personas:
        if persona.id in excluded or persona.id in seen:
            continue
        seen.add(persona.id)
        pool.append(persona)
    if count > len(pool):
        raise UserError(
            f"{source}: {count} users requested but only {len(pool)} distinct personas are "
            "available (after exclude_ids); lower --users or pass a larger --personas file"
        )
    order = list(range(len(pool)))
    random.Random(f"memloop-personas:{seed}").shuffle(order)
    return [pool[i] for i in order[:count]]
