"""The world the assistants live in: the data.json model of simulated users and its generators.

The model: data, datafile, validation, summary. The generators that produce it: catalogue +
procedural.
"""
