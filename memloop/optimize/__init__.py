"""Evolving and tuning memory-write prompts.

Every optimizer follows one contract (contract: an Evolver proposes from one EvolveInput, a
Search turns a run into cycles; both declare a pydantic Settings) and is found by name in one
registry (registry: built-ins, `register`, entry points, `module:Class`). evolve (the conditions
of an experiment) runs a search (searches/: episode, period, gepa) inside a RunContext (context:
the run's spec, users per split, evaluation, logging of the cycles a search yields, the one
selection on validation users); evolvers (evolvers/: none, reflective, playbook, edits; GEPA's
own reflection) propose prompts from a feedback summary; tune searches AWE's settings with
Optuna. A run's identity, folder, cycle records and MLflow record come from memloop.runs; compare,
plots and export read runs back from memloop.results.
"""

from memloop.core.moved import alias

# modules that lived in this package before issue 43, importable by their old names
alias(
    {
        "memloop.optimize.cycles": "memloop.runs.cycles",
        "memloop.optimize.store": "memloop.runs.store",
        "memloop.optimize.compare": "memloop.results.compare",
        "memloop.optimize.plots": "memloop.results.plots",
        "memloop.optimize.export": "memloop.results.export",
        "memloop.optimize.playbook": "memloop.optimize.evolvers.playbook",
        "memloop.optimize.edits": "memloop.optimize.evolvers.edits",
        "memloop.optimize.examples": "memloop.optimize.evolvers.examples",
        "memloop.optimize.episode_search": "memloop.optimize.searches.episode",
        "memloop.optimize.period_cadence": "memloop.optimize.searches.period",
        "memloop.optimize.gepa_search": "memloop.optimize.searches.gepa",
    }
)
