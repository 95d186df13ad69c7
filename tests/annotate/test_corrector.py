"""The corrector: a small model trained here scores calls; calls with unlikely relations score high."""

import bisect
import json
import statistics

from lmlm.annotate.corrector import CallScore, CorrectorConfig, _call_spans, _drop_highest, _ranks, _windows, correct
from lmlm.annotate.corrupt import corrupt_documents, filter_scores
from lmlm.annotate.lm import FitConfig
from lmlm.annotate.validate import validate
from lmlm.lookup import plain_text, strip
from lmlm.tokens import ENTITY, RELATION
from lmlm.worlds.bios import BiosWorld


def test_windows_cover_every_token_once():
    for n, size in ((10, 16), (100, 16), (33, 8)):
        covered = [t for start, end, first in _windows(n, size) for t in range(first, end)]
        assert covered == list(range(n))
        assert all(end - start <= size for start, end, _ in _windows(n, size))


def test_corrector_ranks_relations_the_text_does_not_support(tmp_path):
    world = BiosWorld.generate("smoke")
    damaged = corrupt_documents([d.segments for d in world.train_documents], fraction=0.1, seed=0,
                                kinds=("relation_not_inferable",))
    docs = [validate(d.text, d.annotated).segments for d in damaged]
    config = CorrectorConfig(fit=FitConfig(steps=160, batch_size=8, seq_len=128, lr=1e-2, warmup_steps=10), drop=0.1,
                             vocab_size=1024)
    result = correct(docs, config, out_dir=tmp_path / "corr", progress=False)

    n_calls = sum(len(d.labels) for d in damaged)
    assert len(result.scores) == n_calls
    assert sum(s.dropped for s in result.scores) == round(0.1 * n_calls)
    assert result.stats["final_loss"] < result.stats["first_loss"]
    for before, after in zip(docs, result.documents):
        assert strip(after) == plain_text(before)[0]
    labels = [damaged[s.doc].labels[s.at] for s in result.scores]
    clean = sorted(s.relation_loss for s, lb in zip(result.scores, labels) if not lb)
    bad = [s.relation_loss for s, lb in zip(result.scores, labels) if lb]
    auc = statistics.fmean(bisect.bisect_left(clean, x) / len(clean) for x in bad)  # P(bad above clean)
    assert auc > 0.8, auc  # 0.91-0.96 over seeds 0-2 at 160 steps (0.64-0.80 at 100)
    scores = filter_scores(damaged, result.kept_offsets())
    assert scores["removed"]["relation_not_inferable"] > 0.2 and scores["kept_clean"] > 0.85

    out = tmp_path / "corr"
    report = json.loads((out / "report.json").read_text())
    assert report["dropped"] == round(0.1 * n_calls)
    assert (out / "losses.png").stat().st_size > 10_000
    assert len((out / "scores.jsonl").read_text().splitlines()) == n_calls
    assert len((out / "kept.jsonl").read_text().splitlines()) == len(docs)
    assert (out / "train_log.jsonl").exists()


def test_call_spans_follow_the_roles():
    from lmlm.tokens import LookupTokenizer, train_bpe

    world = BiosWorld.generate("smoke")
    doc = world.train_documents[0]
    tok = LookupTokenizer(train_bpe([d.plain for d in world.train_documents], vocab_size=500))
    enc = tok.encode(doc.segments)
    spans = _call_spans(enc.input_ids, enc.roles, tok.start_id)
    assert len(spans) == len(doc.lookups)
    for (ent, rel), lk in zip(spans, doc.lookups):
        assert all(enc.roles[i] == ENTITY for i in ent) and all(enc.roles[i] == RELATION for i in rel)
        assert tok.decode_field([enc.input_ids[i] for i in ent]) == lk.entity
        assert tok.decode_field([enc.input_ids[i] for i in rel]) == lk.relation


def test_the_drop_share_is_exact_even_when_scores_tie():
    # rank scores tie when one call's entity rank equals another's relation rank: 0.9 three times
    scores = [CallScore(0, i, "e", "r", "v", el, rl, 1, 1, score=sc)
              for i, (sc, el, rl) in enumerate([(0.9, 1.0, 2.0), (0.9, 5.0, 1.0), (0.5, 9.0, 9.0), (0.9, 0.5, 0.5),
                                                (0.1, 0.0, 0.0)])]
    cut = _drop_highest(scores, 0.4)  # round(0.4 * 5) = 2 calls, of the three tied at 0.9
    assert [s.dropped for s in scores] == [True, True, False, False, False]  # the most surprising two
    assert cut == 0.9
    assert not any(s.dropped for s in scores if _drop_highest(scores, 0.0) == float("inf"))


def test_ranks_are_scipys_ordinal_ranks():
    import math
    import random

    from scipy.stats import rankdata

    rng = random.Random(0)
    for n in (0, 1, 2, 7, 50):
        values = [rng.choice((0.5, 1.0, 2.0, rng.random())) for _ in range(n)]  # ties among them
        want = ((rankdata(values, method="ordinal") - 1) / max(n, 1)).tolist()
        assert _ranks(values) == want
    assert all(math.isnan(r) for r in _ranks([1.0, float("nan"), 0.5]))
    assert all(math.isnan(r) for r in ((rankdata([1.0, float("nan"), 0.5], method="ordinal") - 1) / 3).tolist())
