"""NLU multiple choice: BIG-bench format, log-probabilities by hand on a bigram model, acc vs acc_norm,
Social IQa on a tiny model, and the lm-eval adapter."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from eval_support import DictKB

from lmlm.evaluate.harness import HarnessAdapter
from lmlm.evaluate.nlu import (
    MCItem,
    Score,
    choice_scores,
    nlu_eval,
    predictions,
    read_bigbench_mc,
    score_continuations,
    split_pair,
)
from lmlm.scoring import token_logprobs


class BigramLM(torch.nn.Module):
    """Next-token logits depend only on the current token: ``logits = log(weights[token])``."""

    def __init__(self, weights, n_positions: int = 8):
        super().__init__()
        self.table = torch.nn.Parameter(torch.log(torch.tensor(weights, dtype=torch.float)))
        self.config = SimpleNamespace(n_positions=n_positions)

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, T, V)


# token 4 plays a lookup token: banning it renormalizes over tokens 0..3
WEIGHTS = [[1, 2, 1, 4, 8]] + [[1, 1, 1, 1, 4]] * 4


def test_score_continuations_by_hand():
    model = BigramLM(WEIGHTS)
    banned, free = score_continuations(model, [([0], [1, 3]), ([2, 0], [3])], banned=[4]), \
        score_continuations(model, [([0], [1, 3])])
    assert banned[0].logprob == pytest.approx(math.log(2 / 8) + math.log(1 / 4))   # P(1|0) P(3|1), token 4 banned
    assert free[0].logprob == pytest.approx(math.log(2 / 16) + math.log(1 / 8))    # not banned
    assert banned[0].n_tokens == 2 and banned[0].greedy is False                   # argmax after 0 is 3
    assert banned[1].logprob == pytest.approx(math.log(4 / 8)) and banned[1].greedy is True
    # a context longer than the model's 8 positions loses its oldest ids, the score is unchanged
    long = score_continuations(model, [([1] * 20 + [0], [1, 3])], banned=[4])
    assert long[0].logprob == pytest.approx(banned[0].logprob)
    with pytest.raises(ValueError, match="does not fit"):
        score_continuations(model, [([0], [1] * 8)])


def test_acc_and_acc_norm_by_hand():
    item = MCItem("ctx", ("a", "bbbb"), gold=1)
    scores = [Score(-2.0, 1, True), Score(-3.0, 2, False)]
    # sum: -2 > -3 -> 0; per character: -2/1 < -3/4 -> 1; per token: -2 < -3/2 -> 1
    assert predictions(item, scores) == {"acc": 0, "acc_norm": 1, "acc_per_token": 1}
    assert predictions(MCItem("c", ("x", "y"), 0), [Score(-1.0, 1, True)] * 2)["acc"] == 0  # ties: first


def test_read_bigbench(tmp_path):
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"name": "t", "examples": [
        {"input": "Tracy resisted. What does Tracy need to do? ", "target_scores": {"Plan": 0, "Go home": 0, "Hide": 1}},
        {"input": "Sydney felt bad.", "target_scores": {"Sympathetic": 1, "Incredulous": 0}}]}))
    items = read_bigbench_mc(path)
    assert items[0] == MCItem("Q: Tracy resisted. What does Tracy need to do?\nA:", ("Plan", "Go home", "Hide"), 2, "0")
    assert items[1].gold == 0 and len(read_bigbench_mc(path, limit=1)) == 1
    path.write_text(json.dumps({"examples": [{"input": "x", "target": "y"}]}))
    with pytest.raises(ValueError, match="target_scores"):
        read_bigbench_mc(path)
    for examples, msg in (([{"target_scores": {"a": 1, "b": 0}}], "example 1 has no 'input'"),
                          ([{"input": "x", "target_scores": {"a": "1", "b": 0}}], "not all numbers"),
                          ([{"input": "x", "target_scores": {"a": 0, "b": 0}}], "marks no choice right")):
        path.write_text(json.dumps({"examples": examples}))
        with pytest.raises(ValueError, match=msg):
            read_bigbench_mc(path)
    path.write_text(json.dumps({"examples": [{"input": "x", "target_scores": {"a": 1, "b": 0}}]}))
    for template, msg in (("No placeholder", "has no {input}"), ("{question} {input}", "names 'question'")):
        with pytest.raises(ValueError, match=msg):
            read_bigbench_mc(path, template=template)


def test_split_pair_moves_trailing_space(world):
    tok = world.tok
    ctx, cont = split_pair(tok, "Ada Lind works as a ", "baker")
    assert ctx[0] == tok.doc_id and tok.hf.decode(cont).strip() == "baker"
    assert split_pair(tok, "Ada Lind works as a", " baker") == (ctx, cont)


def test_social_iqa_on_a_tiny_model(world, shared_data):
    items = read_bigbench_mc(shared_data / "bigbench" / "social_iqa.json", limit=6)
    assert len(items) == 6 and all(len(it.choices) == 3 for it in items)
    records = []
    m = nlu_eval(world.model, world.tok, items, batch_size=4, records=records)
    assert set(m) == {"nlu_acc", "nlu_acc_norm", "nlu_acc_per_token", "nlu_chance", "nlu_n"} and m["nlu_n"] == 6
    assert m["nlu_chance"] == pytest.approx(1 / 3)  # three choices each: what a guess scores
    assert m["nlu_acc"] == pytest.approx(sum(r["acc"] == r["gold"] for r in records) / 6)
    # parity: batched scores equal one-row scores computed from a plain forward pass
    tok, ban = world.tok, list(world.tok.call_ids)
    for it, r in zip(items[:2], records):
        for choice, lp in zip(it.choices, r["logprobs"]):
            ctx, cont = split_pair(tok, it.context, " " + choice)
            seq = (ctx + cont)[-128:]  # the model's context: the oldest ids go
            with torch.no_grad():
                logits = world.model(torch.tensor([seq])).logits[0].float()
            logits[:, ban] = -math.inf
            logp = torch.log_softmax(logits, -1)
            start = len(seq) - len(cont)
            want = sum(float(logp[start - 1 + k, t]) for k, t in enumerate(cont))
            assert lp == pytest.approx(want, abs=1e-4)
    one = choice_scores(world.model, tok, items[:2], batch_size=1)
    assert [s.logprob for s in one[1]] == pytest.approx(records[1]["logprobs"], abs=1e-4)


def test_harness_adapter(world):
    adapter = HarnessAdapter(world.model, world.tok, DictKB(world.facts), batch_size=4, ban_lookup=False)
    req = lambda *args: SimpleNamespace(args=args)
    (lp, _greedy), = adapter.loglikelihood([req("Ada Lind works as a", " baker")])
    ctx, cont = split_pair(world.tok, "Ada Lind works as a", " baker")
    assert lp == pytest.approx(score_continuations(world.model, [(ctx, cont)])[0].logprob)
    text = "Ada Lind was born in Paris. Ada Lind works as a baker."
    rolling, = adapter.loglikelihood_rolling([req(text)])
    ids = [world.tok.doc_id, *world.tok.encode_text(text)]
    assert rolling == pytest.approx(float(token_logprobs(world.model, [ids])[0].sum()), abs=1e-3)
    long, = adapter.loglikelihood_rolling([req(" ".join([text] * 12))])  # longer than the 128-token context
    assert math.isfinite(long) and long < rolling
    out, = adapter.generate_until([req("Bram Moss was born in", {"until": ["."], "max_gen_toks": 16})])
    assert "." not in out and "<|db" not in out and "dblookup" not in out


def test_lm_eval_registration():
    from lm_eval.api.registry import get_model  # a declared test dependency: imported, never skipped

    from lmlm.evaluate.harness import LMLMEvalModel

    assert get_model("lmlm") is LMLMEvalModel
