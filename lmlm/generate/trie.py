"""Token prefix trees for decoding constraints: :class:`TokenTrie` (fixed sequences, e.g. the
annotator's relation names) and :class:`KeyTrie`, the KB's valid lookup queries.

Each active key ``(entity, relation)`` of a knowledge base becomes one path of token ids
``entity <|sep|> relation <|db_retrieve|>``, tokenized as the model writes a field inside a call.
Decoding constrained by the tree can only write queries the KB holds (the paper's prefix-tree
ablation). The tree follows the KB: :meth:`KeyTrie.refresh` compares ``kb.version`` with the
version it was built from and applies the difference, so a deleted key is unreachable at the next
decoding step. Plain dicts are enough here: one walk per constrained row and step, a few dict hits.

Exercised by ``lmlm generate --constrained``.

Examples:
    >>> trie = KeyTrie(kb, tokenizer)
    >>> len(trie), ("Ada Lovelace", "Birth City") in trie
    (1, True)
    >>> trie.next_tokens([]).tolist() == tokenizer.encode_field("Ada Lovelace")[:1]
    True
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

__all__ = ["TokenTrie", "KeyTrie"]


class _Node:
    """One prefix: its children by token id, how many sequences pass through it, how many end at it."""

    __slots__ = ("children", "count", "ends", "_ids")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0
        self.ends = 0
        self._ids: torch.Tensor | None = None  # children ids, built on first use

    def ids(self) -> torch.Tensor:
        if self._ids is None:
            self._ids = torch.tensor(sorted(self.children), dtype=torch.long)
        return self._ids


class TokenTrie:
    """A counted prefix tree of token sequences: which ids may follow a prefix, and which prefixes
    are whole sequences. Adding a sequence twice needs removing it twice.

    Examples:
        >>> trie = TokenTrie([(5, 7), (5, 8, 9)])
        >>> trie.children((5,)), trie.is_whole((5, 7)), trie.is_whole((5, 8))
        ([7, 8], True, False)
    """

    def __init__(self, sequences: Iterable[Sequence[int]] = ()):
        self._root = _Node()
        for seq in sequences:
            self.insert(seq)

    def __bool__(self) -> bool:
        return self._root.count > 0

    def is_prefix(self, prefix: Sequence[int]) -> bool:
        """Whether ``prefix`` starts at least one sequence."""
        return self._node(prefix) is not None

    def is_whole(self, prefix: Sequence[int]) -> bool:
        """Whether ``prefix`` is one of the sequences."""
        node = self._node(prefix)
        return node is not None and node.ends > 0

    def children(self, prefix: Sequence[int]) -> list[int]:
        """Ids that may follow ``prefix``, ascending (none when it left the tree)."""
        node = self._node(prefix)
        return sorted(node.children) if node is not None else []

    def next_tokens(self, prefix: Sequence[int]) -> torch.Tensor | None:
        """:meth:`children` as a tensor for a logits mask; None when ``prefix`` left the tree or ends it."""
        node = self._node(prefix)
        return node.ids() if node is not None and node.children else None

    def _node(self, prefix: Sequence[int]) -> _Node | None:
        node = self._root
        for t in prefix:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def insert(self, path: Sequence[int]) -> None:
        node = self._root
        node.count += 1
        for t in path:
            child = node.children.get(t)
            if child is None:
                child = node.children[t] = _Node()
                node._ids = None
            child.count += 1
            node = child
        node.ends += 1

    def remove(self, path: Sequence[int]) -> None:
        node = self._root
        node.count -= 1
        for t in path:
            child = node.children[t]
            child.count -= 1
            if child.count == 0:  # no other sequence shares the rest of the path
                del node.children[t]
                node._ids = None
                return
            node = child
        node.ends -= 1


class KeyTrie(TokenTrie):
    """Token prefix tree of ``entity <|sep|> relation <|db_retrieve|>`` for every active KB key.

    Args:
        kb: any object with ``keys() -> [(entity, relation), ...]`` and an integer ``version``
            (a :class:`lmlm.kb.KnowledgeBase`).
        tokenizer: a :class:`lmlm.tokens.LookupTokenizer` (``encode_field``, ``sep_id``, ``retrieve_id``).
    """

    def __init__(self, kb, tokenizer):
        if not hasattr(kb, "keys") or not hasattr(kb, "version"):
            raise TypeError(f"KeyTrie needs a KB with keys() and version, got {type(kb).__name__}")
        super().__init__()
        self.kb, self.tok = kb, tokenizer
        self.version: int | None = None  # the KB version the tree reflects
        self._paths: dict[tuple[str, str], tuple[int, ...]] = {}
        self.refresh()

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return tuple(key) in self._paths

    def paths(self) -> list[tuple[int, ...]]:
        """Every key's token path, as of the last :meth:`refresh`."""
        return list(self._paths.values())

    def path(self, entity: str, relation: str) -> tuple[int, ...]:
        """The token path of a key: entity ids, ``<|sep|>``, relation ids, ``<|db_retrieve|>``."""
        return self._paths[(entity, relation)]

    def refresh(self) -> bool:
        """Catch up with the KB if its version moved; returns whether anything was checked."""
        version = self.kb.version
        if version == self.version:
            return False
        keys = set(self.kb.keys())
        for key in [k for k in self._paths if k not in keys]:
            self.remove(self._paths.pop(key))
        new = [k for k in keys if k not in self._paths]
        for key, path in zip(new, self._encode(new)):
            self._paths[key] = path
            self.insert(path)
        self.version = version
        return True

    # -- pieces ---------------------------------------------------------------------------------
    def _encode(self, keys: Iterable[tuple[str, str]]) -> list[tuple[int, ...]]:
        """Token paths of keys; each distinct entity and relation string is encoded once."""
        memo: dict[str, list[int]] = {}

        def field(s: str) -> list[int]:
            if s not in memo:
                memo[s] = self.tok.encode_field(s)
            return memo[s]

        sep, ret = self.tok.sep_id, self.tok.retrieve_id
        return [(*field(e), sep, *field(r), ret) for e, r in keys]
