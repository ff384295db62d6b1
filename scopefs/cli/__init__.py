"""The ``scopefs`` command line: thin wiring over the rooms below it, no policy.

``main`` parses one command and calls one function; ``output`` prints its
answer as lines for people or one JSON object for programs.
"""
