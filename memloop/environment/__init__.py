"""The world the assistants live in: the data.json model of simulated users (data, datafile,
validation, summary) and the generators that produce it (catalogue + procedural).
"""
