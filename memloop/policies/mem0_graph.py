"""AWE's mem0 graph memory on Kùzu: how relations read, and checkpoints of the graph.

mem0's Kùzu graph (mem0/memory/kuzu_memory.py) keeps `Entity` nodes (a name, a mention count, a
creation time, the name's embedding) and `CONNECTED_TO` relations between them (a name, a mention
count, creation and update times). A checkpoint writes both as JSON: nodes in the order of their
serial ids, relations in storage order, each relation naming its nodes by their place in the node
list, so saving a loaded graph writes the same bytes. Loading opens a fresh in-memory database and
recreates them in that order, so the graph answers queries as the saved one did; no LLM call is
needed.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json
from memloop.policies.base import read_json

GRAPH_FILE = "graph.json"
_NODE_FIELDS = ("user_id", "agent_id", "run_id", "name", "mentions")
_TIMES = ("created", "updated")


def relation_line(relation: dict[str, Any]) -> str:
    """One relation as shown in context and in the memory view: `source -- relation -- target`.

    mem0 names the far end `destination` in search results and `target` in get_all.
    """
    target = relation.get("destination", relation.get("target"))
    return f"{relation['source']} -- {relation['relationship']} -- {target}"


def _time(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


def save_graph(graph: Any, path: Path) -> None:
    """Write every node and relation of mem0's Kùzu graph `graph` to `path`."""
    nodes = graph.kuzu_execute(
        "MATCH (n:Entity) RETURN n.id AS id, n.user_id AS user_id, n.agent_id AS agent_id, "
        "n.run_id AS run_id, n.name AS name, n.mentions AS mentions, n.created AS created, "
        "n.embedding AS embedding ORDER BY n.id"
    )
    place = {node["id"]: i for i, node in enumerate(nodes)}
    relations = graph.kuzu_execute(
        "MATCH (a:Entity)-[r:CONNECTED_TO]->(b:Entity) RETURN a.id AS source, b.id AS target, "
        "id(r) AS rid, r.name AS name, r.mentions AS mentions, r.created AS created, "
        "r.updated AS updated"
    )
    relations.sort(key=lambda r: (r["rid"]["table"], r["rid"]["offset"]))
    atomic_write_json(
        path,
        sort_keys=True,
        indent=None,
        value={
            "dims": graph.embedding_dims,
            "nodes": [
                {
                    **{k: node[k] for k in _NODE_FIELDS},
                    "created": _time(node["created"]),
                    "embedding": node["embedding"],
                }
                for node in nodes
            ],
            "relations": [
                {
                    "source": place[r["source"]],
                    "target": place[r["target"]],
                    "name": r["name"],
                    "mentions": r["mentions"],
                    **{k: _time(r[k]) for k in _TIMES},
                }
                for r in relations
            ],
        },
    )


def load_graph(graph: Any, path: Path) -> None:
    """Replace mem0's Kùzu graph `graph` by the one saved at `path` (a fresh in-memory database)."""
    import kuzu

    data = read_json(path)
    dims = graph.embedding_dims
    if data.get("dims") != dims:
        raise UserError(
            f"{path}: a graph of {data.get('dims')}-dimensional names, but embedding_model "
            f"gives {dims}"
        )
    close_graph(graph)
    graph.db = kuzu.Database(":memory:")
    graph.graph = kuzu.Connection(graph.db)
    graph.kuzu_create_schema()
    ids = []
    for node in data["nodes"]:
        created = node["created"]
        row = graph.kuzu_execute(
            "CREATE (n:Entity {user_id: $user_id, agent_id: $agent_id, run_id: $run_id, "
            "name: $name, mentions: $mentions, created: $created, "
            f"embedding: CAST($embedding, 'FLOAT[{dims}]')}}) RETURN n.id AS id",
            parameters={
                **{k: node[k] for k in _NODE_FIELDS},
                "created": datetime.fromisoformat(created) if created else None,
                "embedding": node["embedding"],
            },
        )
        ids.append(row[0]["id"])
    for relation in data["relations"]:
        graph.kuzu_execute(
            "MATCH (a:Entity {id: $source}), (b:Entity {id: $target}) "
            "CREATE (a)-[:CONNECTED_TO {name: $name, mentions: $mentions, created: $created, "
            "updated: $updated}]->(b)",
            parameters={
                "source": ids[relation["source"]],
                "target": ids[relation["target"]],
                "name": relation["name"],
                "mentions": relation["mentions"],
                **{k: datetime.fromisoformat(relation[k]) if relation[k] else None for k in _TIMES},
            },
        )


def close_graph(graph: Any) -> None:
    """Close the graph's Kùzu connection and database (a second call does nothing)."""
    for handle in (graph.graph, graph.db):
        if handle is not None:
            handle.close()
    graph.graph = graph.db = None
