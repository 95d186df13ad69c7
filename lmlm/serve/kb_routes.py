"""Knowledge-base routes: reads are open (lookup, search, a triple by id, the log, the version);
writes (add, edit, delete, forget a set) need the bearer token and run one at a time on the
server's KB writer thread. A write's response carries the version it made; from then on every
lookup, and every generation that starts, sees it.
"""


from dataclasses import asdict
from typing import Annotated, Optional

from fastapi import APIRouter, Depends, HTTPException, Path, Query

from ..kb import KBError, Triple
from .schemas import (MAX_ID, KBVersion, LogResponse, LookupResponse, SearchResponse, TripleOut, VersionDetail,
                      WriteResponse, utf8_text, request_models)

__all__ = ["router"]


def _match(m) -> dict | None:
    return None if m is None else {**asdict(m), "sources": [str(s) for s in m.sources]}


def router(state, require_token) -> APIRouter:
    L, kb = state.limits, state.kb
    R = request_models(L)
    api = APIRouter(prefix="/api/kb", tags=["kb"])
    Field_ = Annotated[str, Query(min_length=1, max_length=L.max_field_chars)]
    writes = dict(dependencies=[Depends(require_token)],
                  responses={401: {"description": "no or wrong bearer token"},
                             403: {"description": "writes are disabled on this server"}})

    def field(name: str, value: str) -> str:
        if "\ufffd" in value:  # what the URL decoder makes of bytes that are not UTF-8 (%FF, %ED%A0%80)
            raise HTTPException(422, f"{name}: the query string is not valid UTF-8 (percent-encode UTF-8 bytes)")
        try:
            return utf8_text(value)
        except ValueError as e:
            raise HTTPException(422, f"{name}: {e}") from None

    # -- reads ------------------------------------------------------------------------------------
    @api.get("/version", response_model=KBVersion, summary="The KB's current version and number of active triples")
    async def version():
        return await state.read(lambda: {"version": kb.version, "triples": len(kb)})

    @api.get("/lookup", response_model=LookupResponse, summary="Look a key up as the generator does "
             "(the entity first, then the relation among its keys); a miss says which step failed")
    async def lookup(entity: Field_, relation: Field_,
                     threshold: Annotated[Optional[float], Query(ge=0, le=1)] = None,
                     context: Annotated[Optional[str], Query(max_length=L.max_prompt_chars, description=(
                         "the text before the call (the names it may refer to), as the generator passes it"))] = None):
        e, r = field("entity", entity), field("relation", relation)
        c = None if context is None else field("context", context)

        def read():
            m = kb.explain(e, r, context=c, threshold=threshold)
            miss = None if m else {"reason": m.reason, "detail": m.detail, "entity": m.entity,
                                   "candidates": [[str(n), float(s)] for n, s in m.candidates]}
            return {"match": _match(m) if m else None, "miss": miss, "version": kb.version}

        return await state.read(read)

    @api.get("/search", response_model=SearchResponse, summary="The k nearest keys with their scores, "
             "ignoring the threshold")
    async def search(entity: Field_, relation: Field_, k: Annotated[int, Query(ge=1, le=L.max_search_k)] = 5):
        e, r = field("entity", entity), field("relation", relation)
        return await state.read(lambda: {"matches": [_match(m) for m in kb.search(e, r, k)], "version": kb.version})

    @api.get("/triples/{triple_id}", response_model=TripleOut, summary="A triple by id, active or deleted",
             responses={404: {"description": "no such triple"}})
    async def triple(triple_id: Annotated[int, Path(ge=1, le=MAX_ID)]):
        def get():
            try:
                rec = kb.get(triple_id)
            except KeyError:
                raise HTTPException(404, f"no triple with id {triple_id}") from None
            return {**rec.to_dict(), "active": rec.active}
        return await state.read(get)

    @api.get("/log", response_model=LogResponse, summary="The latest versions, newest first: who changed what, "
             "when and why")
    async def log(limit: Annotated[int, Query(ge=1, le=L.max_log)] = 20):
        return await state.read(lambda: {"versions": [asdict(v) for v in kb.log(limit)], "version": kb.version})

    @api.get("/log/{version}", response_model=VersionDetail,
             summary="One version and what it did to each triple and alias",
             responses={404: {"description": "no such version"}})
    async def version_detail(version: Annotated[int, Path(ge=1, le=MAX_ID)]):
        def get():
            current = kb.version
            if version > current:
                raise HTTPException(404, f"no version {version}: the KB is at version {current}")
            found = [v for v in kb.log(current - version + 1) if v.version == version]
            if not found:
                raise HTTPException(404, f"no version {version} in the log")
            added, removed = kb.alias_diff(version - 1, version)
            return {"record": asdict(found[0]), "changes": [asdict(c) for c in kb.changes(version)],
                    "aliases_added": [{"alias": r.alias, "entity": r.entity} for r in added],
                    "aliases_removed": [{"alias": r.alias, "entity": r.entity} for r in removed]}
        return await state.read(get)

    # -- writes -----------------------------------------------------------------------------------
    async def write(fn) -> dict:
        """Run ``fn() -> (version, changed)`` on the writer thread; bad input is a 422."""
        try:
            version, changed = await state.write(fn)
        except KBError as e:
            raise HTTPException(404, str(e)) from None
        except (ValueError, TypeError) as e:
            raise HTTPException(422, str(e)) from None
        return {"version": version, "changed": changed}

    def changed(before: int, after: int) -> int:
        """What the write that took the KB from ``before`` to ``after`` changed (0: it made no version)."""
        return kb.log(1)[0].n_changed if after > before else 0

    @api.post("/triples", response_model=WriteResponse, summary="Add facts as one new version", **writes)
    async def add(body: R.AddRequest):
        def run():
            before = kb.version
            v = kb.add([Triple(t.entity, t.relation, t.value, source=t.source) for t in body.triples],
                       who=body.who, why=body.why, once=True)  # a retried request counts once
            return v, changed(before, v)
        return await write(run)

    @api.post("/edit", response_model=WriteResponse, summary="Give a fact a new value (the old one stays in history)",
              dependencies=writes["dependencies"],
              responses={**writes["responses"], 404: {"description": "no active fact to edit"}})
    async def edit(body: R.EditRequest):
        def run():
            before = kb.version
            v = kb.edit(body.entity, body.relation, body.value, who=body.who, why=body.why)
            return v, changed(before, v)
        return await write(run)

    @api.post("/delete", response_model=WriteResponse, summary="Delete the active facts matching every filter",
              **writes)
    async def delete(body: R.DeleteRequest):
        def run():
            n = kb.delete(triple_ids=body.triple_ids, entity=body.entity, relation=body.relation,
                          source=body.source, who=body.who, why=body.why)
            if n == 0:  # a typo is a 404 naming it; what was deleted before is a change of nothing
                never_held(body.triple_ids, [body.entity], [body.source], body.relation)
            return kb.version, n
        return await write(run)

    def never_held(ids, entities, sources, relation=None) -> None:
        """KBError (a 404) naming the ids, entities, relation or sources the KB never held, in any version."""
        from ..kb.knowledge_base import never_held_item

        items = [*(ids or ()), *({"entity": e} for e in entities if e), *({"source": s} for s in sources if s)]
        missing = [why for item in items if (why := never_held_item(kb, item))]
        missing += [f"never held the relation {relation!r}"] if relation and kb.never_held(relation=relation) else []
        if missing:
            raise KBError("nothing was deleted, since the KB never held what these name: " + "; ".join(missing))

    @api.post("/forget", response_model=WriteResponse, summary="Delete a forget set (entities, sources, ids) "
              "as one version", **writes)
    async def forget(body: R.ForgetRequest):
        def run():
            never_held(body.triple_ids, body.entities, body.sources)  # a typo anywhere: nothing deleted
            items = [{"entity": e} for e in body.entities] + [{"source": s} for s in body.sources] + body.triple_ids
            n = kb.forget(items, who=body.who, why=body.why)  # as `lmlm kb delete --forget`: one version
            return kb.version, n
        return await write(run)

    @api.post("/restore", response_model=WriteResponse, summary="Make the active facts and aliases those of a "
              "past version (as new versions; history is kept)", dependencies=writes["dependencies"],
              responses={**writes["responses"], 404: {"description": "no such version"}})
    async def restore(body: R.RestoreRequest):
        from ..kb.knowledge_base import restore_version

        def run():
            r = restore_version(kb, body.version, who=body.who, why=body.why)
            return r.version, r.changed
        return await write(run)

    return api
