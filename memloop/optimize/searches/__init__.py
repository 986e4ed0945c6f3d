"""The searches: each turns a run into cycles of evaluated prompts.

One module per search; base.py states the order the run calls a search in.
"""
