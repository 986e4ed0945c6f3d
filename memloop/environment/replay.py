"""Off-policy replay (the paper's section 4.2): check that a recorded run fits the users.

A recorded run is the ``--out`` folder of an earlier ``memloop eval`` (its conversations live in
``episodes/<user>/period_XX/record.json``). Before its conversations are fed to another policy
with ``ingest``, every user to evaluate must have a recording with the same id, every period to
evaluate and, in each period, as many sessions as the environment has; anything else is a user
error naming the file and what differs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from memloop.core.errors import UserError
from memloop.core.files import safe_name
from memloop.environment.data import UserItem
from memloop.environment.episode import load_record, period_dir


def check_recording(items: list[UserItem], run_dir: str | Path, periods: int | None = None) -> Path:
    """The episodes folder of the recorded run ``run_dir``, checked against ``items``.

    Args:
        items: the users to evaluate.
        run_dir: an earlier eval's output folder (or its ``episodes`` folder).
        periods: evaluate only the first ``periods`` periods (None: all of them).

    Raises:
        UserError: the folder is missing, or a user, a period or a session count differs.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise UserError(f"--replay {root}: no such folder (give an earlier eval's --out folder)")
    episodes = root / "episodes" if (root / "episodes").is_dir() else root
    recorded = sorted(p.name for p in episodes.iterdir() if p.is_dir())
    for item in items:
        user_dir = episodes / safe_name(item.id)
        if not user_dir.is_dir():
            shown = ", ".join(recorded[:5]) + (", ..." if len(recorded) > 5 else "")
            raise UserError(
                f"--replay {root}: no recording of user {item.id!r} (recorded: {shown or 'none'})"
            )
        wanted = len(item.periods) if periods is None else min(periods, len(item.periods))
        for p in range(wanted):
            path = period_dir(user_dir, p) / "record.json"
            if not path.is_file():
                raise UserError(
                    f"{path}: missing; user {item.id!r} is evaluated on {wanted} periods but the "
                    f"recording stops before period {p}"
                )
            try:
                record = load_record(path)
            except (ValidationError, ValueError, OSError) as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise UserError(f"{path}: not a period record ({first})") from None
            if record.user_id != item.id or record.period != p:
                raise UserError(
                    f"{path}: records user {record.user_id!r} period {record.period}, "
                    f"expected user {item.id!r} period {p}"
                )
            expected = len(item.periods[p].sessions)
            if len(record.sessions) != expected:
                raise UserError(
                    f"{path}: {len(record.sessions)} sessions recorded, but user {item.id!r} has "
                    f"{expected} in period {p} of this environment"
                )
    return episodes
