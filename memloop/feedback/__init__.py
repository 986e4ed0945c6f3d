"""What a run's episodes mean: probes, scoring, diagnosis, recall, summaries and reports.

probes (the questions asked after a period), scoring (accuracy, random, upper bound, memory score,
state accuracy, failure classes), exposure (what memory could hold), calibration (the recall
checker against known truth), summary (the feedback an evolver sees, per `objective.Mode`, within
a size budget), objective (the `Objective` every selection ranks on, one default rule), report
(metrics.json, plots), evaluate (episodes to metrics) and import_amemgym (published runs).
"""
