"""Reading runs back: compare, plots and export.

compare pairs like runs and makes the tables and the selection's gate; plots draws the figures of
a run and of a comparison; export writes a run's selected prompts as text, a DSPy program or a
mem0 config. This floor reads what memloop.runs wrote (run folders, cycle records, MLflow runs
through the tracker) and never runs a model or an optimizer; memloop.optimize draws its figures
and tables with it.
"""
