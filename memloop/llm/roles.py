"""One chat client per role (agent, user_sim, checker, optimizer) from endpoint files.

Roles on the same endpoint share one client, and all share one response cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint, EndpointRef, load_endpoint

ROLES = ("agent", "user_sim", "checker", "optimizer")


@dataclass
class RoleClients:
    agent: ChatClient
    user_sim: ChatClient
    checker: ChatClient
    optimizer: ChatClient

    @classmethod
    def from_files(
        cls,
        agent: EndpointRef = None,
        user_sim: EndpointRef = None,
        checker: EndpointRef = None,
        optimizer: EndpointRef = None,
        *,
        cache: Any = "default",
    ) -> RoleClients:
        """Endpoint YAML (or an Endpoint made in memory) per role; None = the embedded model.

        Every endpoint is loaded and its key variable read before a client (or the response
        cache) is made: a bad file or an unset key is refused before a command writes anything.
        """
        endpoints = [load_endpoint(ref) for ref in (agent, user_sim, checker, optimizer)]
        for endpoint in dict.fromkeys(endpoints):
            endpoint.api_key()  # MissingApiKey, one line naming the variable (never the key)
        made: dict[Any, ChatClient] = {}

        def get(endpoint: Endpoint) -> ChatClient:
            if endpoint not in made:
                shared = next(iter(made.values())).cache if made else cache
                made[endpoint] = ChatClient(endpoint, cache=shared)
            return made[endpoint]

        return cls(*(get(endpoint) for endpoint in endpoints))

    def preflight(self) -> None:
        """`ChatClient.preflight` of each distinct endpoint: before any progress is shown."""
        seen: set[int] = set()
        for role in ROLES:
            client = getattr(self, role)
            if id(client) not in seen:
                seen.add(id(client))
                client.preflight()

    @classmethod
    def single(cls, client: ChatClient) -> RoleClients:
        """Every role on one client (tests, benchmarks, a one-endpoint setup)."""
        return cls(client, client, client, client)

    def with_draw(self, draw: int) -> RoleClients:
        """The roles drawing repeat `draw` (ChatClient.with_draw); shared clients stay shared."""
        made: dict[int, ChatClient] = {}

        def get(client: ChatClient) -> ChatClient:
            if id(client) not in made:
                made[id(client)] = client.with_draw(draw)
            return made[id(client)]

        return RoleClients(*(get(getattr(self, role)) for role in ROLES))

    def sampled(self) -> bool:
        """Whether the agent or the simulated user samples (temperature > 0): repeats can differ."""
        return any((c.endpoint.temperature or 0) > 0 for c in (self.agent, self.user_sim))

    def identity(self) -> dict[str, Any]:
        """Each role's result-changing endpoint settings (no secrets), for a run's identity."""
        return {role: getattr(self, role).endpoint.result_settings() for role in ROLES}
