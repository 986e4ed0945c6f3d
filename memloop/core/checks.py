"""What every conformance suite shares: a report of checks made and promises broken."""

from __future__ import annotations

from dataclasses import dataclass, field


class ContractError(AssertionError):
    """One or more promises of a contract are broken; the message lists them."""


@dataclass
class CheckReport:
    """The checks a conformance suite made (``checks``) and the ones that failed (``problems``)."""

    name: str
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    outcomes: list[tuple[str, str | None]] = field(default_factory=list)  # (check, problem|None)
    section: str = ""  # the part of the suite running now: each outcome is recorded under it
    sections: list[str] = field(default_factory=list)  # each outcome's section, in order

    def grouped(self) -> list[tuple[str, list[tuple[str, str | None]]]]:
        """The outcomes by section, in the order they were recorded."""
        groups: list[tuple[str, list[tuple[str, str | None]]]] = []
        for section, outcome in zip(self.sections, self.outcomes, strict=True):
            if not groups or groups[-1][0] != section:
                groups.append((section, []))
            groups[-1][1].append(outcome)
        return groups

    @property
    def ok(self) -> bool:
        return not self.problems

    def expect(self, condition: bool, check: str, problem: str) -> bool:
        """Record ``check``; when ``condition`` is false, also record ``problem``."""
        self.checks.append(check)
        self.outcomes.append((check, None if condition else problem))
        self.sections.append(self.section)
        if not condition:
            self.problems.append(problem)
        return condition

    def finish(
        self, error: type[ContractError], contract: str, raise_on_problem: bool
    ) -> CheckReport:
        """Return the report, or raise ``error`` listing every problem of the ``contract``."""
        if raise_on_problem and self.problems:
            head = f"{self.name} breaks the {contract} contract:"
            raise error("\n- ".join([head, *self.problems]))
        return self
