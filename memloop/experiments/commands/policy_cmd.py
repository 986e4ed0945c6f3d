"""`memloop policy check FILE.yaml`: the Policy contract's conformance suite on any policy.

It builds the policy the YAML names (built-in or plug-in), drives fresh instances through the
suite (environment/policy_check.py) and prints each check; every broken promise is one line, and
the exit status is 2 when there is one.
"""

from __future__ import annotations

import argparse
import tempfile

from memloop.experiments.commands.options import (
    CommandGroup,
    add_cache_option,
    add_endpoint_options,
    add_group,
    endpoint_ref,
)

GROUP = CommandGroup(
    "policy",
    help="policies: check one against the Policy contract",
    description="Memory policies: check one (built-in or plug-in) against the Policy contract.",
    example="memloop policy check memloop/experiments/policies/native.yaml",
)


def register(sub: argparse._SubParsersAction) -> None:
    policy_sub = add_group(sub, GROUP)
    check = policy_sub.add_parser(
        "check",
        help="run the Policy conformance suite on the policy a YAML file names "
        "(type: awi, or package.module:Class, or path/to/file.py:Class)",
        description="Drive fresh instances of the policy a YAML file names through the Policy "
        "contract's conformance suite; every broken promise is one line, exit code 2.",
        example="memloop policy check memloop/experiments/policies/native.yaml",
    )
    check.add_argument("policy", metavar="FILE.yaml", help="policy YAML")
    add_endpoint_options(
        check, "endpoint YAML of the policy's model (default: the embedded local model)"
    )
    add_cache_option(check)
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.core.tables import printable
    from memloop.environment.policy_check import check_policy
    from memloop.policies import build_policy
    from memloop.runs.inputs import load_policy, roles

    config = load_policy(args.policy)
    client = roles(endpoint_ref(args), cache=args.cache or "default").agent
    name = printable(config.display_name)
    print(f"policy {name} ({printable(args.policy)}), model {printable(client.endpoint.model)}")
    with tempfile.TemporaryDirectory(prefix="memloop-policy-check-") as tmp:
        count = 0

        def fresh():
            nonlocal count
            count += 1
            return build_policy(config, client, f"{tmp}/policy-{count}")

        try:
            report = check_policy(fresh, workdir=tmp, raise_on_problem=False)
        except UserError:
            raise  # a cache, endpoint or input fault: the usual one line, not the policy's fault
        except Exception as exc:  # the policy's own error stops the suite: name it
            first = printable(f"{type(exc).__name__}: {exc}".splitlines()[0])
            print(f"FAIL the suite stopped: the policy raised {first}")
            return 2
    for section, outcomes in report.grouped():  # under each check's heading
        print(f"{section}:")
        for check, problem in outcomes:
            print(f"  ok  {check}" if problem is None else f"FAIL {check}: {printable(problem)}")
    if report.problems:
        broken = len(report.problems)
        print(f"{name}: {broken} broken promise(s) of the Policy contract")
        return 2
    print(f"{name}: meets the Policy contract ({len(report.checks)} checks)")
    return 0
