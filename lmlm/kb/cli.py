"""``lmlm kb``: build, query and edit a knowledge base (:class:`lmlm.kb.KnowledgeBase`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from ..cli_errors import fail as _fail
from ..jsonio import write_jsonl
from .formats import UNSOURCED_DOC

app = typer.Typer(no_args_is_help=True, help="Build, query and edit a knowledge base.")
alias_app = typer.Typer(no_args_is_help=True, help="Other names of entities (short names, redirects, 'Last, First').")
app.add_typer(alias_app, name="alias")
console = Console(soft_wrap=True)  # piped output keeps one line per line (no wrap at 80)
err = Console(stderr=True, soft_wrap=True)


# -- knowledge base --------------------------------------------------------------------------------

_FORMATS = ("jsonl, parquet, corpus (annotated documents), authors (their database JSON) or csv (a header with "
            "entity, relation, value; .tsv too); default: from the file")


def _open_kb(path: Path, at: Optional[int] = None):
    from ..kb import KBError, KnowledgeBase

    try:
        kb = KnowledgeBase.open(path)
        return kb if at is None else kb.checkout(at)
    except KBError as e:
        _fail(str(e))


def _kb_call(fn, *args, **kwargs):
    """Run a KB call, turning the errors a user can fix into one red line."""
    from ..kb import KBError

    try:
        return fn(*args, **kwargs)
    except (KBError, ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, ImportError) as e:
        _fail(str(e))


@app.command("build")
def kb_build(path: Path = typer.Argument(..., help="KB folder: created, or resumed after a build was cut short"),
             triples: Path = typer.Option(..., help="triples (JSONL, CSV/TSV or Parquet; JSONL and CSV may be "
                                                     "gzipped), an annotated corpus, or the authors' JSON"),
             format: Optional[str] = typer.Option(None, help=_FORMATS),
             chunk_size: int = typer.Option(100_000, help="facts per version; a crash loses at most one chunk"),
             embed: bool = typer.Option(True, help="embed every key now (--no-embed: on the first fuzzy lookup)"),
             aliases: Optional[Path] = typer.Option(None, help="also add these aliases (JSONL with alias, entity; "
                                                                "e.g. the aliases.jsonl of lmlm world)"),
             append: bool = typer.Option(False, "--append", help="build on a KB that holds facts from other data"),
             who: str = typer.Option("lmlm"), why: str = typer.Option("build")):
    """Create a KB from a file, resumably: after a crash, run the same command again to go on."""
    from ..kb import build
    from ..kb.formats import read_aliases

    pairs = _kb_call(read_aliases, aliases) if aliases is not None else None
    fresh = not path.exists()
    try:
        kb = _kb_call(build, path, triples, format=format, chunk_size=chunk_size, who=who, why=why, embed=embed,
                      append=append)
    except typer.Exit:
        if fresh and _empty_kb(path):  # bad input before any fact: no empty KB left behind to look built
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        raise
    if pairs:
        _kb_call(kb.add_aliases, pairs, who=who, why=f"{why}: aliases from {aliases.name}")
    _say_skipped(kb)
    console.print_json(json.dumps(kb.stats(), default=str))


def _say_skipped(kb) -> None:
    """One line on stderr for the triplets of an authors' database that were not three non-empty fields."""
    skipped = (getattr(kb, "last_import", None) or {}).get("skipped", 0)
    if skipped:
        err.print(f"[yellow]{skipped:,} triplet(s) of {Path(kb.last_import['source']).name} skipped: not three "
                  "non-empty fields (entity, relation, value)[/]")


def _empty_kb(path: Path) -> bool:
    """Whether ``path`` is a KB folder at version 0 (created, nothing stored)."""
    from ..kb import KnowledgeBase

    if not (path / "kb.sqlite").exists():
        return path.is_dir() and not any(path.iterdir())
    try:
        kb = KnowledgeBase.open(path)
    except Exception:  # a KB that cannot be opened is not ours to remove
        return False
    try:
        return kb.version == 0
    finally:
        kb.close()


@app.command("add")
def kb_add(path: Path, entity: str, relation: str, value: str, source: Optional[str] = typer.Option(None),
           who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Add one fact (one already there gains support from a new --source; without one, adding it again
    changes nothing)."""
    from ..kb import Triple

    kb = _open_kb(path)
    before = kb.version
    version = _kb_call(lambda: kb.add([Triple(entity, relation, value, source=source)], who=who, why=why,
                                      once=True))
    console.print(f"version {version}" if version != before else
                  f"version {version}: nothing changed (the fact is active already"
                  + (f" with the source {source!r})" if source else ")"), highlight=False)


@app.command("edit")
def kb_edit(path: Path, entity: str, relation: str, value: str, who: str = typer.Option("lmlm"),
            why: str = typer.Option("")):
    """Give a fact a new value (the old one stays in the history)."""
    kb = _open_kb(path)
    before = kb.version
    version = _kb_call(kb.edit, entity, relation, value, who=who, why=why)
    console.print(f"version {version}" if version != before else
                  f"version {version}: nothing changed ({value!r} is already the only active value)", highlight=False)


def _read_forget_set(path: Path) -> list[tuple[int, object]]:
    """``(line, item)`` of each item of a JSONL forget set; ValueError names a line that is no item."""
    from .records import forget_item

    items = []
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                item = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line: {e}") from None
            try:
                forget_item(item, lineno)
            except (ValueError, TypeError):
                raise ValueError(f"{path}:{lineno}: not a forget item ({{\"id\"}}, {{\"source\"}}, {{\"entity\"}} "
                                 f"or {{\"entity\", \"relation\"[, \"value\"]}}): {line.strip()[:80]}") from None
            items.append((lineno, item))
    if not items:
        raise ValueError(f"{path}: the forget set is empty (one {{id}}, {{source}}, {{entity}} or "
                         f"{{entity, relation}} per line)")
    return items


@app.command("delete")
def kb_delete(path: Path,
              triple_id: List[int] = typer.Option(None, "--id", "--triple-id",
                                                  help="a triple's id (repeatable; the server's 'triple_ids')"),
              entity: Optional[str] = None,
              relation: Optional[str] = None, source: Optional[str] = None,
              forget: Optional[Path] = typer.Option(None, help="JSONL forget set: one {id}, {source}, {entity} "
                                                              "or {entity, relation[, value]} per line"),
              who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Delete facts by id, entity, relation, source document or a forget set; unreachable at once."""
    if not (triple_id or entity or relation or source or forget):
        _fail("say what to delete: --id, --entity, --relation, --source or --forget FILE")
    if forget and (triple_id or entity or relation or source):
        _fail("--forget deletes the listed facts alone; give the other filters in a separate call")
    kb = _open_kb(path)
    if forget:
        if not forget.is_file():
            _fail(f"no forget set at {forget}")
        items = _kb_call(_read_forget_set, forget)
        from .knowledge_base import never_held_item

        never = [f"{forget}:{line}: {why_not}" for line, item in items if (why_not := never_held_item(kb, item))]
        if never:  # a typo deletes nothing and says so; the set is applied whole or not at all
            _fail(f"{len(never)} of {len(items)} forget items name what {path} never held, so nothing was deleted: "
                  + "; ".join(never[:5]) + ("; ..." if len(never) > 5 else ""))
        n = _kb_call(lambda: kb.forget([item for _, item in items], who=who, why=why))
        if n == 0:
            err.print("no active fact matched: they were deleted before (`lmlm kb log` says when)", highlight=False)
    else:
        n = _kb_call(kb.delete, triple_ids=triple_id or None, entity=entity, relation=relation, source=source,
                     who=who, why=why)
        if n == 0:
            _nothing_deleted(kb, path, triple_id, entity, relation, source)
    console.print(f"deleted {n} facts; version {kb.version}")


def _nothing_deleted(kb, path: Path, triple_ids, entity, relation, source) -> None:
    """A delete that matched nothing: a name the KB never held (a typo) fails, naming what is close;
    one it held, all of whose facts are gone already (the same command again), is said and exits 0."""
    unknown = [i for i in triple_ids or () if not _held_id(kb, i)]
    if unknown:
        _fail(f"{path} has no triple with id {', '.join(map(str, unknown))}")
    names = {"entity": entity, "relation": relation, "source": source}
    never = kb.never_held(entity, relation, source)
    if never:
        close = ""
        if "entity" in never:
            found = kb.explain(entity, relation or "-")  # a match, or a miss naming the entity or candidates
            cands = [found.entity] if found.entity else [c for c, _ in getattr(found, "candidates", ())][:3]
            close = f" (closest: {', '.join(map(repr, cands))})" if cands else ""
        _fail(f"{path} never held " + " or ".join(f"the {k} {names[k]!r}" for k in never) + close
              + "; `lmlm kb search` finds what it holds")
    given = [k for k in names if names[k] is not None] + (["id"] if triple_ids else [])
    if len(given) > 1:  # each name held, but maybe never together: a fact with all of them, deleted or not?
        from .keys import normalize_text as norm

        def fits(r) -> bool:
            return ((entity is None or norm(r.entity) == norm(entity)) and (source is None or any(
                d == source for d, _ in r.sources)) and (relation is None or norm(r.relation) == norm(relation)))
        if triple_ids:
            records = [kb.get(i) for i in triple_ids]
        elif entity is not None and relation is not None:
            records = kb.history(entity, relation)
        else:
            records = None  # no cheap way to look: say both possibilities
        if records is not None and not any(fits(r) for r in records):
            _fail(f"no fact of {path}, active or deleted, has all of " + ", ".join(
                f"--{k} {names.get(k) if k != 'id' else ','.join(map(str, triple_ids))!s}" for k in given))
        if records is None:
            err.print("no active fact matched these filters together: deleted before, or none ever had them all "
                      "(`lmlm kb log` says what was deleted)", highlight=False)
            return
    err.print("no active fact matched: they were deleted before (`lmlm kb log` says when)", highlight=False)


def _held_id(kb, triple_id: int) -> bool:
    try:
        kb.get(triple_id)
        return True
    except KeyError:
        return False


@app.command("lookup")
def kb_lookup(path: Path, entity: str, relation: str,
              threshold: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="minimum similarity (relation "
                                                        "under entity matching, the whole key under key)"),
              at: Optional[int] = typer.Option(None, help="read the KB as it was at this version"),
              context: Optional[str] = typer.Option(None, help="the text before the call (names it may refer to)"),
              matching: str = typer.Option("entity", help="'entity' (entity first, then relation) or 'key' "
                                                          "(the paper's single-key cosine)"),
              all_values: bool = typer.Option(False, "--all", help="also list every value of the matched key")):
    """Look one key up as the generator would; a miss says which step failed ({"miss": ...})."""
    if matching not in ("entity", "key"):
        _fail(f"--matching must be 'entity' or 'key', got {matching!r}")
    kb = _open_kb(path, at)
    m = _kb_call(kb.explain, entity, relation, context=context, threshold=threshold, matching=matching)
    if not m:
        print(json.dumps({"miss": m.to_dict()}, default=str, indent=2, ensure_ascii=False))
        return
    out = m.to_dict()
    if all_values:
        out = {**out, "values": [r.to_dict() for r in kb.values(m.entity, m.relation)]}
    print(json.dumps(out, default=str, indent=2, ensure_ascii=False))


@alias_app.command("add")
def kb_alias_add(path: Path, alias: Optional[str] = typer.Argument(None, help="another name"),
                 entity: Optional[str] = typer.Argument(None, help="the entity it names"),
                 file: Optional[Path] = typer.Option(None, "--file", help="JSONL of {alias, entity} lines instead"),
                 who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Record another name of an entity (or every pair of --file) as one version."""
    from ..kb.formats import read_aliases

    if file is None and (alias is None or entity is None):
        _fail("give ALIAS and ENTITY, or --file aliases.jsonl")
    if file is not None and alias is not None:
        _fail("give ALIAS and ENTITY or --file, not both")
    pairs = _kb_call(read_aliases, file) if file is not None else [(alias, entity)]
    kb = _open_kb(path)
    before = kb.stats()["aliases"]
    version = _kb_call(kb.add_aliases, pairs, who=who, why=why, strict=True)
    console.print(f"{kb.stats()['aliases'] - before} aliases added; version {version}")
    unknown = sorted(e for e in {e for _, e in pairs} if kb.never_held(e))  # one query an entity
    if unknown:  # kept: an alias of an entity without facts is used once it has some
        err.print(f"note: {len(unknown)} of the entities named have no facts in {path} yet (first: {unknown[0]!r}); "
                  "their aliases answer nothing until they do", highlight=False, markup=False)


@alias_app.command("list")
def kb_alias_list(path: Path, entity: Optional[str] = typer.Option(None, help="only this entity's aliases"),
                  as_json: bool = typer.Option(False, "--json")):
    """The active aliases, oldest first."""
    rows = _open_kb(path).aliases(entity)
    if as_json:
        print(json.dumps([{"alias": a.alias, "entity": a.entity} for a in rows], indent=2, ensure_ascii=False))
        return
    for a in rows:
        console.print(f"{a.alias} → {a.entity}", highlight=False, markup=False)
    err.print(f"{len(rows)} aliases")


@alias_app.command("delete")
def kb_alias_delete(path: Path, alias: str, entity: Optional[str] = typer.Option(None, help="only as an alias of "
                                                                                         "this entity"),
                    who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Delete an alias (of every entity it names, or of --entity only)."""
    kb = _open_kb(path)
    n = _kb_call(kb.delete_alias, alias, entity, who=who, why=why)
    if not n:
        _fail(f"no alias {alias!r}" + (f" of {entity!r}" if entity else "") + f" in {path}")
    console.print(f"deleted {n} aliases; version {kb.version}")


def _show(text) -> str:
    """A stored string as the terminal should see it: control characters escaped, no Rich markup."""
    from rich.markup import escape

    from ..kb.keys import printable

    return escape(printable(str(text)))


@app.command("search")
def kb_search(path: Path, entity: str, relation: str, k: int = typer.Option(5, "-k", "--k", min=1),
              at: Optional[int] = typer.Option(None, help="read the KB as it was at this version"),
              as_json: bool = typer.Option(False, "--json")):
    """Top-k candidate keys with their cosine scores (why did a lookup match, or not?): ✓ marks the fact a
    lookup answers, = a key equal to the query's; a miss says why."""
    kb = _open_kb(path, at)
    hits = _kb_call(kb.search, entity, relation, k=k)
    if as_json:
        print(json.dumps([m.__dict__ for m in hits], default=str, indent=2))
        return
    answer = kb.lookup(entity, relation)  # what a lookup answers: entity-aware unless the KB uses the paper's match
    for m in hits:
        mark = "✓" if answer is not None and m.triple_id == answer.triple_id else ("=" if m.exact else " ")
        console.print(f"{m.score:.3f} {mark} {_show(m.entity)} · {_show(m.relation)} → {_show(m.value)}  "
                      f"(triple {m.triple_id}, seen {m.support}x, {m.alternatives} other values)", highlight=False)
    if answer is None:
        miss = kb.explain(entity, relation)
        console.print(f"a lookup misses: {getattr(miss, 'reason', '')} {getattr(miss, 'detail', '')}".rstrip(),
                      highlight=False)


@app.command("stats")
def kb_stats(path: Path, at: Optional[int] = typer.Option(None, help="counts as of this version")):
    """Counts, the current version and the index kind."""
    console.print_json(json.dumps(_open_kb(path, at).stats(), default=str))


@app.command("log")
def kb_log(path: Path, limit: int = typer.Option(20, min=1, help="the latest versions shown"),
           as_json: bool = typer.Option(False, "--json")):
    """The latest versions: who changed what and why."""
    log = _open_kb(path).log(limit)
    if as_json:
        print(json.dumps([v.__dict__ for v in log], indent=2))
        return
    for v in log:
        what = "aliases" if v.op in ("alias", "unalias") else "triples"
        console.print(f"v{v.version:<5} {v.time}  {v.op:<7} {v.n_changed:>8} {what}  {_show(v.who)}: {_show(v.why)}",
                      highlight=False)


@app.command("diff")
def kb_diff(path: Path, v1: int, v2: int, as_json: bool = typer.Option(False, "--json"),
            limit: int = typer.Option(50, min=1, help="lines to print (all with --json)")):
    """What changed between two versions: added, removed and re-supported triples, and aliases."""
    kb = _open_kb(path)
    entries = _kb_call(kb.diff, v1, v2)
    added, removed = kb.alias_diff(v1, v2)
    names = [("added", r) for r in added] + [("removed", r) for r in removed]
    if as_json:
        print(json.dumps([e.to_dict() for e in entries] + [{"op": op, "alias": r.alias, "entity": r.entity}
                                                          for op, r in names], indent=2, ensure_ascii=False))
        return
    sign = {"added": "[green]+[/]", "removed": "[red]-[/]", "support": "[yellow]~[/]"}
    for e in entries[:limit]:
        counts = f"{e.count_before} → {e.count_after}" if e.op == "support" else e.count_before or e.count_after
        console.print(f"{sign[e.op]} {_show(e.entity)} · {_show(e.relation)} → {_show(e.value)}  "
                      f"(triple {e.triple_id}, count {counts})", highlight=False)
    for op, r in names[:max(0, limit - len(entries))]:
        console.print(f"{sign[op]} alias {_show(r.alias)} → {_show(r.entity)}", highlight=False)
    ops = {op: sum(e.op == op for e in entries) for op in sign}
    shown = len(entries) + len(names)
    console.print(f"v{v1} → v{v2}: {ops['added']} added, {ops['removed']} removed, {ops['support']} re-supported"
                  + (f"; aliases {len(added)} added, {len(removed)} removed" if names else "")
                  + (f" ({shown - limit} more not shown)" if shown > limit else ""))


@app.command("checkout")
def kb_checkout(path: Path, version: int, out: Optional[Path] = typer.Option(None, help="also write its triples here"),
                format: Optional[str] = typer.Option(None, help="jsonl, parquet or corpus (default: from OUT)")):
    """Read a past version: its counts, and with --out its triples (the KB itself is not changed)."""
    view = _open_kb(path, version)
    if out is not None:
        n = _kb_call(view.export, out, format)
        err.print(f"{n} triples of version {version} written to {out}")
    console.print_json(json.dumps(view.stats(), default=str))


@app.command("restore")
def kb_restore(path: Path, version: int, who: str = typer.Option("lmlm"), why: str = typer.Option("")):
    """Make the active facts and aliases those of a past version, as new versions (history is kept;
    facts written back get new ids, with their counts and sources then); again after a crash: the rest."""
    from .knowledge_base import restore_version

    kb = _open_kb(path)
    r = _kb_call(restore_version, kb, version, who=who, why=why)
    console.print(f"version {r.version}: as at version {version}: {r.removed} facts deleted, {r.added} written back"
                  + (f", aliases {r.aliases_added} added and {r.aliases_removed} deleted"
                     if r.aliases_added or r.aliases_removed else "")
                  if r.changed else f"version {r.version}: nothing to restore (the KB holds what version "
                                    f"{version} held)", highlight=False)


@app.command("export")
def kb_export(path: Path, out: Path, format: Optional[str] = typer.Option(
                  None, help="jsonl or parquet (an exact copy: counts, sources), or corpus (annotated documents, one "
                             "per source, to read or train on: a fact's count is not kept, and unsourced facts go "
                             f"to '{UNSOURCED_DOC}'); default: from OUT's suffix"),
              at: Optional[int] = typer.Option(None, help="export the KB as it was at this version")):
    """Write the active triples with their counts and sources, and the aliases beside them
    (OUT's name with .aliases.jsonl, for `kb build --aliases`)."""
    kb = _open_kb(path, at)
    console.print(f"{_kb_call(kb.export, out, format)} triples written to {out}")
    rows = kb.aliases()  # at --at, the aliases active then
    if rows:
        side = out.with_name(out.name.split(".")[0] + ".aliases.jsonl")
        write_jsonl(side, ({"alias": r.alias, "entity": r.entity} for r in rows))
        console.print(f"{len(rows)} aliases written to {side} (lmlm kb build KB --triples {out} --aliases {side})",
                      highlight=False)


@app.command("import")
def kb_import(path: Path, triples: Path, format: Optional[str] = typer.Option(None, help=_FORMATS),
              who: str = typer.Option("lmlm"), why: str = typer.Option("import")):
    """Add the facts of a file (a version per 100,000); resumable, and the same file twice adds nothing.

    A changed file is read again: its new facts go in, and no fact it held before counts twice.
    """
    kb = _open_kb(path)
    before = kb.version
    after = _kb_call(kb.import_file, triples, format, who=who, why=why)
    _say_skipped(kb)
    info = getattr(kb, "last_import", None) or {}
    lock = (f"; {info['chunks']} chunk(s), the longest held the write lock {info['longest_lock_seconds']:.2f} s"
            if info.get("chunks") else "")
    console.print(f"version {after}{lock}" if after != before else
                  f"version {after}: nothing new ({triples.name} is in already, or every fact of it was)")
