"""The trusted catalog: identity, sessions, stores, revisions, policy and audit.

This package imports nothing else of ours. Everything that decides who may
see what lives here, so that the writer, the filesystem and the sandbox all
consult one source of truth.
"""
