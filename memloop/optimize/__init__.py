"""Evolving and tuning memory-write prompts, and comparing the results.

evolve (the conditions of an experiment) runs a search (episode, period, gepa; searches is the
registry) inside a RunContext (context: the run's spec, users per split, evaluation, logging of
the cycles a search yields, the one selection on validation users). Evolvers (reflective,
playbook) propose prompts from a feedback summary; tune searches AWE's settings with Optuna;
compare reads the runs back from MLflow and pairs like runs. A run's identity, folder and MLflow
record come from memloop.runs.
"""
