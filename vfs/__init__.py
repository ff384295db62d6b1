"""The per-session FUSE view (pyfuse3 + trio): arrives with issue 3.

It will serve one session's view from ``catalog`` (reads verified against
the active revision's hash) and hand every change to ``writer``.
"""
