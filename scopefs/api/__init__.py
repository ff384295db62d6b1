"""The local API a gateway calls: session capabilities over the same operations as the CLI.

Thin, no policy (DESIGN.md §2): every decision is the catalog's and the
writer's. What this room adds is the binding of a request to the session
it may act for: ``capabilities`` seals a session, actor and policy
revision into an opaque, expiring token, ``replay`` refuses a request
seen before, and ``service`` runs one request against the home.
"""
