"""Reading runs back: rows, tables, compare, plots and export.

rows reads an experiment's runs from MLflow (through the tracker) and pairs like runs; tables
makes compare's tables; compare is `memloop compare` (with the prompt diff and the curves);
plots draws the figures of a run and of a comparison; export writes a run's selected prompts as
text, a DSPy program or a mem0 config. This floor reads what memloop.runs wrote and never runs a
model or an optimizer; memloop.optimize draws its figures and tables with it.
"""
