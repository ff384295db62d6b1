"""The ``scopefs`` command line: thin wiring over catalog and writer, no policy."""
