"""Listing a folder of a session's view.

Folders are implicit in note paths. A listing shows the view's roots at the
top and, below them, only notes the evaluator lets this subject ``read``
(the decision ``read`` itself makes, so the two never disagree): a hidden
note leaves no name, size or gap behind, and a folder that holds only
hidden notes does not appear at all. A folder that does not
exist and one that is not in the view are refused alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopefs.catalog.access import Access, authorize_session
from scopefs.catalog.audit import record
from scopefs.catalog.home import Home
from scopefs.catalog.paths import split_virtual_path
from scopefs.catalog.policy import Op, ResourceState, evaluate
from scopefs.catalog.reasons import Reason
from scopefs.catalog.stores import find_store, live_resources_under, policy_entries


@dataclass(frozen=True)
class Listed:
    name: str
    is_dir: bool
    size: int  # 0 for folders


def _virtual_children(access: Access, parts: tuple[str, ...]) -> list[Listed] | None:
    """Children that come from the view's roots alone (``/``, ``roles/``, above a delegated session's caps)."""
    names: dict[str, bool] = {}
    for top in access.view.roots():
        root = tuple(top.split("/"))
        if len(root) > len(parts) and root[: len(parts)] == parts:
            names[root[len(parts)]] = True
    if not names:
        return None
    return [Listed(name, True, 0) for name in sorted(names)]


def list_folder(home: Home, session_id: str, path: str = "", *, actor_id: str | None = None) -> list[Listed]:
    parts = split_virtual_path(path) if path else ()
    access = authorize_session(home, session_id, Op.RETRIEVE, actor_id=actor_id)
    virtual = _virtual_children(access, parts)
    if virtual is None and not parts:
        virtual = []  # a view with no roots (an agent a pools file does not declare): the top is empty
    if virtual is not None:
        record(home.state(), access.event(Op.RETRIEVE, "allow", Reason.ALLOWED))
        return virtual
    found = access.view.folder_mount(parts)
    if found is None:
        raise access.refuse_outside(Op.RETRIEVE, parts)
    mount, inner = found
    access = access.in_cell(mount.cell)
    catalog = home.catalog(access.agent_id)
    store = find_store(catalog, access.agent_id, mount.scope_kind, mount.audience_id)
    children: dict[str, Listed] = {}
    if store is not None:
        prefix = "/".join(inner) + "/" if inner else ""
        for resource, revision in live_resources_under(catalog, access.agent_id, store.store_id, prefix):
            entries = policy_entries(catalog, access.agent_id, store.store_id, resource.resource_id)
            state = ResourceState(resource.state == "live", revision.state, revision.held, revision.valid_until)
            # The same decision a read makes: retrieve alone lets a candidate
            # exist inside the broker, never its name or size outside it.
            if not evaluate(Op.READ, access.session.subject, mount, state, entries, access.now):
                continue
            if not access.view.permits((*mount.root.split("/"), *resource.path.split("/"))):
                continue  # outside a delegated session's caps
            rest = resource.path[len(prefix):].split("/")
            if len(rest) == 1:
                children[rest[0]] = Listed(rest[0], False, revision.size)
            else:
                children.setdefault(rest[0], Listed(rest[0], True, 0))
    if inner and not children and "/".join(parts) not in access.view.roots():  # empty or invisible: "not there"
        raise access.refuse(Op.RETRIEVE, Reason.OUTSIDE_VIEW, store_id=store.store_id if store else None)
    record(home.state(), access.event(Op.RETRIEVE, "allow", Reason.ALLOWED, store_id=store.store_id if store else None))
    return [children[name] for name in sorted(children)]
