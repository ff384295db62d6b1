"""scopefs: identity-aware memory for agents that talk to many people.

One distribution, one top-level name. The rooms below it import in one
direction only (DESIGN.md §2):

    catalog  <-  writer  <-  vfs  <-  sandbox  <-  cli

``catalog`` decides who may see what, ``writer`` is the only code that
changes artifacts, ``vfs`` serves one session's view as a FUSE mount,
``sandbox`` runs commands whose whole world is that mount, and ``cli`` is
the ``scopefs`` command line. This module imports nothing, so that
``python -m scopefs.vfs.server`` and the command line load only what they use.
"""
