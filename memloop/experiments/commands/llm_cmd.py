"""`memloop llm check`: one schema-constrained call to an endpoint, then the same call again.

The second call shows that it is served from the response cache.
"""

from __future__ import annotations

import argparse
import time

from memloop.experiments.commands.options import (
    CommandGroup,
    add_cache_option,
    add_endpoint_options,
    add_group,
    endpoint_ref,
)

GROUP = CommandGroup(
    "llm",
    help="model endpoints",
    description="Model endpoints: check that one answers schema-constrained JSON.",
    example="memloop llm check --model local-0.5b",
)


CHECK_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 80},  # bounded: a runaway answer ends in JSON
        "population_millions": {"type": "number"},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "population_millions", "is_capital"],
    "additionalProperties": False,
}
CHECK_MESSAGES = [
    {"role": "system", "content": "You answer with a single JSON object and nothing else."},
    {
        "role": "user",
        "content": "Describe Paris, France: its name, its population in millions "
        "and whether it is its country's capital.",
    },
]


def register(sub: argparse._SubParsersAction) -> None:
    llm_sub = add_group(sub, GROUP)
    check = llm_sub.add_parser(
        "check",
        help="ask the endpoint for a small JSON object, then repeat it from the cache",
        description="One schema-constrained call to the endpoint, then the same call again "
        "(served from the response cache).",
        example="memloop llm check --model local-0.5b",
    )
    add_endpoint_options(check, "endpoint YAML (default: the embedded local model)")
    add_cache_option(check)
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import load_endpoint

    endpoint = load_endpoint(endpoint_ref(args))
    client = ChatClient(endpoint, cache=args.cache or "default")
    print(f"endpoint: {endpoint.base_url}  model: {endpoint.model}")
    try:
        if endpoint.is_local:
            started = time.perf_counter()
            url = client.resolved_base_url()
            print(
                f"embedded model serving at {url} "
                f"(verified and started in {time.perf_counter() - started:.1f} s)"
            )
        results = []
        for attempt in ("first call", "repeat"):
            sent_before = client.requests_sent
            started = time.perf_counter()
            result = client.chat_json(
                CHECK_MESSAGES, CHECK_SCHEMA, component="probe", refresh=(attempt == "first call")
            )
            elapsed = time.perf_counter() - started
            new = client.requests_sent - sent_before
            source = "cache" if result.cached else "endpoint"
            print(
                f"{attempt}: model={result.model}  latency={elapsed * 1000:.1f} ms  "
                f"tokens={result.prompt_tokens}+{result.completion_tokens}  "
                f"json_valid={result.ok}  served_from={source}  new_requests={new}"
            )
            if not result.ok:
                print(f"  invalid JSON: {result.json_error}; text: {result.text[:200]!r}")
            else:
                print(f"  {result.parsed}")
            results.append(result)
    finally:
        client.close()
    ok = results[0].ok and results[1].cached
    print("check passed" if ok else "check FAILED")
    return 0 if ok else 1
