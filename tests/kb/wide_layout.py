"""A knowledge base written by schema 3 (the wide layout), for the migration tests of both stores."""

from lmlm.kb import Triple

# a KB of schema 3 (the wide layout: names in every triple row, values in every change row) after
# v1 add (Ada's city from two places, Turing's job), v2 support, v3 edit of Turing's job, v4 forget
# of Ada's city (her alias dropped with it)
WIDE_LAYOUT = """
    INSERT INTO meta VALUES ('format', 'lmlm-kb'), ('encoder', 'all-MiniLM-L6-v2');
    INSERT INTO versions VALUES (1, 't', 'a', '', 'add', 3), (2, 't', 'a', '', 'add', 1),
        (3, 't', 'b', '', 'edit', 2), (4, 't', 'c', '', 'delete', 1), (5, 't', 'a', '', 'alias', 1);
    INSERT INTO keys VALUES (1, 'ada lovelace' || char(9) || 'birth city', 'Ada Lovelace', 'Birth City'),
        (2, 'alan turing' || char(9) || 'occupation', 'Alan Turing', 'Occupation');
    INSERT INTO triples VALUES
        (1, 1, 'Ada Lovelace', 'Birth City', 'London', 'ada lovelace' || char(9) || 'birth city',
         'ada lovelace', 'birth city', 'london', 3, 1, 4),
        (2, 2, 'Alan Turing', 'Occupation', 'mathematician', 'alan turing' || char(9) || 'occupation',
         'alan turing', 'occupation', 'mathematician', 1, 1, 3),
        (3, 2, 'alan turing', 'occupation', 'computer scientist', 'alan turing' || char(9) || 'occupation',
         'alan turing', 'occupation', 'computer scientist', 1, 3, NULL);
    INSERT INTO sources(triple_id, doc_id, position, version) VALUES (1, 'bio-ada', 10, 1), (1, 'bio-ada-2', NULL, 1),
        (2, 'bio-turing', 0, 1), (1, 'bio-ada-3', 5, 2);
    INSERT INTO changes(version, triple_id, op, old_value, new_value, count_delta) VALUES
        (1, 1, 'add', NULL, 'London', 2), (1, 2, 'add', NULL, 'mathematician', 1),
        (2, 1, 'support', 'London', 'London', 1), (3, 2, 'edit', 'mathematician', 'computer scientist', 0),
        (3, 3, 'add', NULL, 'computer scientist', 1), (4, 1, 'delete', 'London', NULL, 0);
    INSERT INTO aliases VALUES (1, 'Alan', 'alan', 'Alan Turing', 'alan turing', 5, NULL),
        (2, 'Lovelace', 'lovelace', 'Ada Lovelace', 'ada lovelace', 1, 4);
    CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (3);
"""


def check_wide_layout_migrated(kb) -> None:
    """What a KB of ``WIDE_LAYOUT`` reads as after the migration to the compact layout."""
    assert [(c.version, c.triple_id, c.op, c.old_value, c.new_value) for v in range(1, 5) for c in kb.changes(v)] == [
        (1, 1, "add", None, "London"), (1, 2, "add", None, "mathematician"),
        (2, 1, "support", "London", "London"),
        (3, 2, "edit", "mathematician", "computer scientist"), (3, 3, "add", None, "computer scientist"),
        (4, 1, "delete", "London", None)]
    assert kb.lookup("Ada Lovelace", "Birth City", fuzzy=False) is None
    m = kb.lookup("alan", "occupation", fuzzy=False)  # through the alias that stayed
    assert (m.value, m.entity, m.relation, m.sources) == ("computer scientist", "Alan Turing", "Occupation", ())
    past = kb.checkout(2).lookup("Ada Lovelace", "Birth City", fuzzy=False)
    assert (past.value, past.support, past.sources) == ("London", 3, ("bio-ada", "bio-ada-2", "bio-ada-3"))
    assert [(r.value, r.entity, r.deleted_version) for r in kb.history("Alan Turing", "Occupation")] == [
        ("mathematician", "Alan Turing", 3), ("computer scientist", "Alan Turing", None)]
    assert [(d.op, d.entity, d.value, d.count_before, d.count_after) for d in kb.diff(1, 4)] == [
        ("removed", "Ada Lovelace", "London", 2, 0), ("removed", "Alan Turing", "mathematician", 1, 0),
        ("added", "Alan Turing", "computer scientist", 0, 1)]
    assert kb.key_ids() == {("Alan Turing", "Occupation"): 2}  # key ids (the index's vector ids) kept
    assert kb.forget([{"source": "bio-turing"}], who="d") == 0  # the edited-away triple is already gone
    kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-4"),
            Triple("Alan Turing", "Birth City", "London", source="bio-turing")], who="e")
    assert kb.key_ids() == {("Alan Turing", "Occupation"): 2, ("Ada Lovelace", "Birth City"): 1,
                            ("Alan Turing", "Birth City"): 3}
    assert kb.stats()["triples"] == 3
