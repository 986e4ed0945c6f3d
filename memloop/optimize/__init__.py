"""Evolving and tuning memory-write prompts, and comparing the results.

Every optimizer follows one contract (contract: an Evolver proposes from one EvolveInput, a
Search turns a run into cycles; both declare a pydantic Settings) and is found by name in one
registry (registry: built-ins, `register`, entry points, `module:Class`). evolve (the conditions
of an experiment) runs a search (episode, period, gepa) inside a RunContext (context: the run's
spec, users per split, evaluation, logging of the cycles a search yields, the one selection on
validation users); evolvers (reflective, playbook; GEPA's own reflection) propose prompts from a
feedback summary; tune searches AWE's settings with Optuna; compare reads the runs back from
MLflow and pairs like runs. A run's identity, folder and MLflow record come from memloop.runs.
"""
