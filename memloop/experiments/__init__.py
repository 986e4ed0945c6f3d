"""The `memloop` command line and the shipped YAML files.

cli and commands/ hold the commands; endpoints/, policies/, env/, evolve/ and tune/ the YAML files.
"""
