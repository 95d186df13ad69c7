"""The synthetic people of ``lmlm bench kb``: facts and their key vectors made when read, and the
queries a model might write for them (paraphrased relations, typos, dropped initials). Exercised by
``lmlm bench kb``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["RELATIONS", "SyntheticTriples", "SyntheticVectors", "perturb"]

# relation -> paraphrases a model might write instead
RELATIONS = {
    "Birth City": ("birthplace", "city of birth", "born in"),
    "Birth Date": ("date of birth", "born on", "birthday"),
    "Occupation": ("job", "profession", "works as"),
    "Employer": ("employed by", "works for", "company"),
    "Alma Mater": ("university", "studied at", "college attended"),
    "Spouse": ("married to", "husband or wife", "partner"),
    "Nationality": ("citizenship", "country of citizenship", "nationality of"),
    "Death Year": ("year of death", "died in", "year died"),
    "Father": ("dad", "name of father", "father is"),
    "Award": ("prize", "honour received", "award won"),
}
_FIRST = ("Ada Alan Grace Marie Charles Emmy Niels Lise Paul Rosalind Srinivasa Sofia Kurt Barbara Claude "
          "Dorothy Enrico Hedy Isaac Johanna Katherine Leonhard Max Nikola Olga Pierre Rachel Werner Yuri Zora "
          "Amara Bruno Chiara Diego Elena Farid Greta Hiroshi Ines Jonas Kamala Lars Mina Nadia Omar Priya "
          "Quentin Rosa Samir Tara Umberto Vera Wen Ximena Yusuf Zeynep").split()
_LAST = ("Lovelace Turing Hopper Curie Babbage Noether Bohr Meitner Dirac Franklin Ramanujan Kovalevskaya "
         "Godel McClintock Shannon Hodgkin Fermi Lamarr Newton Kepler Johnson Euler Planck Tesla Ladyzhenskaya "
         "Curran Carson Heisenberg Gagarin Neale Okafor Bianchi Conti Ferreira Ionescu Haddad Lindqvist Tanaka "
         "Moreau Schmidt Harris Nilsson Mendes Kaur Rahman Quispe Ortega Sato Volkov Weber Xu Yilmaz Zeller "
         "Abara Brandt Castillo Dubois Eriksen Fischer").split()


class SyntheticTriples(Sequence):
    """``n`` facts ``(entity, relation, value, source, position)``, ten relations per person in order,
    made when read from one integer per person: 10^7 facts as tuples would take gigabytes of the
    memory the benchmark measures."""

    def __init__(self, n: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        people = -(-n // len(_RELS))
        space = len(_FIRST) * 26 * len(_LAST) * 100
        if people > space:
            raise ValueError(f"at most {space * len(_RELS)} synthetic triples, asked for {n}")
        self.n, self.codes = n, rng.choice(space, size=people, replace=False)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(f"fact {i} of {self.n}")
        p, j = divmod(i % self.n, len(_RELS))
        return _fact(p, _name(int(self.codes[p])), j)

    def __iter__(self) -> Iterator[tuple[str, str, str, str, int]]:
        for p, code in enumerate(self.codes.tolist()):
            name = _name(code)
            for j in range(min(len(_RELS), self.n - p * len(_RELS))):
                yield _fact(p, name, j)

    def keys(self) -> "Sequence[tuple[str, str]]":
        """The ``(entity, relation)`` of each fact, the same way (one key per fact here)."""
        return _Keys(self)


class _Keys(Sequence):
    """The keys of :class:`SyntheticTriples`, made the same way."""

    def __init__(self, rows: SyntheticTriples):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i][:2] if not isinstance(i, slice) else [r[:2] for r in self.rows[i]]


_RELS = list(RELATIONS)


class SyntheticVectors:
    """Unit key vectors for the ``n`` facts of :class:`SyntheticTriples` (one key each), made a block
    of ``BLOCK`` keys at a time from ``(seed, block)``, so any block or row comes out the same
    whenever it is asked for and 5 x 10^7 vectors (77 GB as float32) are never held.

    The keys ``sample`` (sorted indices) keep their real embeddings ``real``; every other key gets the
    real embedding of a random sampled key of the same relation plus Gaussian noise of norm
    ``noise`` (cosine about 0.8 to it), made unit length.
    """

    BLOCK = 65_536

    def __init__(self, n: int, real: np.ndarray, sample: np.ndarray, seed: int = 0, noise: float = 0.75):
        self.n, self.real, self.sample, self.seed, self.noise = n, real.astype(np.float32), sample, seed, noise
        self.dim = real.shape[1]
        rel = sample % len(_RELS)  # fact i = person * 10 + relation
        self._pools = [np.flatnonzero(rel == r) for r in range(len(_RELS))]
        self._pools = [p if len(p) else np.arange(len(sample)) for p in self._pools]

    @property
    def blocks(self) -> int:
        return -(-self.n // self.BLOCK)

    def block(self, b: int) -> np.ndarray:
        """The vectors of keys ``[b * BLOCK, min((b + 1) * BLOCK, n))``, float32 ``(m, dim)``."""
        start, end = b * self.BLOCK, min((b + 1) * self.BLOCK, self.n)
        rng = np.random.default_rng([self.seed, b])
        rel = np.arange(start, end) % len(_RELS)
        base = np.empty(end - start, dtype=np.int64)
        for r, pool in enumerate(self._pools):
            at = rel == r
            base[at] = pool[rng.integers(len(pool), size=int(at.sum()))]
        g = rng.standard_normal((end - start, self.dim), dtype=np.float32)
        g *= self.noise / np.linalg.norm(g, axis=1, keepdims=True)
        v = self.real[base] + g
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        lo, hi = np.searchsorted(self.sample, [start, end])
        v[self.sample[lo:hi] - start] = self.real[lo:hi]
        return v

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first key index, vectors)`` per block, in order."""
        for b in range(self.blocks):
            yield b * self.BLOCK, self.block(b)

    def training_rows(self, count: int) -> np.ndarray:
        """About ``count`` vectors to train the key index on: whole blocks drawn at random, so only
        ``count / BLOCK`` blocks are made where ``count`` scattered rows would make every block once
        more (834 blocks, 12 min at 5.46 x 10^7 keys). A block is as mixed as the KB: its keys'
        relations cycle and their bases are drawn at random."""
        picked = np.random.default_rng([self.seed, self.blocks]).permutation(self.blocks)[:-(-count // self.BLOCK)]
        return np.concatenate([self.block(b) for b in np.sort(picked).tolist()])[:count]

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """The vectors of keys ``idx`` (any order), made block by block."""
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty((len(idx), self.dim), dtype=np.float32)
        blocks = idx // self.BLOCK
        for b in np.unique(blocks).tolist():
            at = np.flatnonzero(blocks == b)
            out[at] = self.block(b)[idx[at] - b * self.BLOCK]
        return out


def _name(code: int) -> str:
    code, suffix = divmod(code, 100)
    code, last = divmod(code, len(_LAST))
    first, initial = divmod(code, 26)
    return f"{_FIRST[first]} {chr(65 + initial)}. {_LAST[last]}" + (f" {suffix}" if suffix else "")


def _fact(p: int, name: str, j: int) -> tuple[str, str, str, str, int]:
    rel = _RELS[j]
    return name, rel, f"{rel.split()[-1]} {(p * 7919 + j * 104729) % 5003}", f"doc-{p}", 60 * j


def perturb(rng: np.random.Generator, entity: str, relation: str) -> tuple[str, str]:
    """A query for the key as a model might write it: paraphrased relation, often a typo or a dropped initial."""
    rel = RELATIONS[relation][rng.integers(3)]
    words = entity.split()
    r = rng.random()
    if r < 0.3 and len(words) > 2:
        words = [w for w in words if not (len(w) == 2 and w.endswith("."))]
    elif r < 0.6:
        w = max(range(len(words)), key=lambda i: len(words[i]))
        s = words[w]
        if len(s) > 3:
            i = int(rng.integers(1, len(s) - 2))
            words[w] = s[:i] + s[i + 1] + s[i] + s[i + 2:]
    return " ".join(words).lower() if rng.random() < 0.5 else " ".join(words), rel
