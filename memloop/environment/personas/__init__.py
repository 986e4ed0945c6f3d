"""Persona files shipped with memloop.

personas.jsonl: twenty hand-written personas in the column layout of Nemotron-Personas (plus a
`name`), the default input of `memloop env generate`.
"""
