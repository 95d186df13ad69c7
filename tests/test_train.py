"""Pretraining: packing and labels from roles, a real tiny model really trained, resume and DDP parity."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lmlm.checkpoint import load_checkpoint
from lmlm.lookup import parse, strip
from lmlm.tokens import CALL, IGNORE_INDEX, ORG, VALUE, LookupTokenizer, train_bpe
from lmlm.corpus import read_documents
from lmlm.train import TrainConfig, _Batches, encode_documents, evaluate_loss, learning_rate, main, pack, train

ROOT = Path(__file__).resolve().parents[1]

FIRST = ["Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kofi", "Lena",
         "Marta", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wanda", "Yusuf"]
LAST = ["Albers", "Brandt", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Horvat", "Ivanova", "Jansen",
        "Kowalski", "Larsen", "Moreau", "Novak", "Okafor", "Petrov"]
CITIES = ["London", "Paris", "Lisbon", "Oslo", "Vienna", "Prague", "Madrid", "Dublin", "Warsaw", "Athens"]
JOBS = ["painter", "chemist", "architect", "violinist", "engineer", "historian", "surgeon", "poet"]


def biographies(n: int, seed: int = 0) -> list[str]:
    """Annotated one-paragraph biographies: text with lookup calls before each fact."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        city, job, year = rng.choice(CITIES), rng.choice(JOBS), rng.randint(1900, 1999)
        out.append(f"{name} was born in [dblookup('{name}', 'Birth City') -> {city}] {city} in "
                   f"[dblookup('{name}', 'Birth Year') -> {year}] {year}. {name.split()[0]} worked as a "
                   f"[dblookup('{name}', 'Occupation') -> {job}] {job} and later moved to "
                   f"{rng.choice(CITIES)}, where the family still lives.")
    return out


@pytest.fixture(scope="module")
def docs():
    return [parse(t).segments for t in biographies(240)]


@pytest.fixture(scope="module")
def tok(docs):
    return LookupTokenizer(train_bpe([strip(d) for d in docs], vocab_size=400))


def _config(tmp_path, name="run", **kw) -> TrainConfig:
    base = dict(model="gpt2-tiny", seq_len=64, micro_batch_size=4, batch_size=8, max_steps=8, warmup_steps=2,
                lr=3e-3, log_every=1, progress=False, threads=1, out_dir=str(tmp_path / name))
    return TrainConfig(**{**base, **kw})


def _losses(out_dir) -> list[float]:
    lines = [json.loads(ln) for ln in (Path(out_dir) / "train_log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if "loss" in r]


# -- data -----------------------------------------------------------------------------------------

def test_lmlm_and_standard_share_org_tokens(docs, tok):
    lmlm = encode_documents(docs, tok, "lmlm")
    standard = encode_documents(docs, tok, "standard")
    for a, b in zip(lmlm, standard):
        assert [t for t, r in zip(a.input_ids, a.roles) if r == ORG] == b.input_ids
        assert set(b.roles) == {ORG}
        assert set(a.roles) == {0, 1, 2, 3, 4}


def test_pack_preserves_every_token_and_role(docs, tok):
    enc = encode_documents(docs[:30], tok, "lmlm")
    ids = [t for e in enc for t in e.input_ids]
    roles = [r for e in enc for r in e.roles]
    packed = pack(enc, 64, tok.end_id, pad_id=tok.eos_id)
    assert packed.input_ids.shape == packed.roles.shape == packed.labels.shape == (-(-len(ids) // 64), 64)
    assert packed.input_ids.flatten()[:len(ids)].tolist() == ids
    assert packed.roles.flatten()[:len(ids)].tolist() == roles
    assert (packed.labels.flatten()[len(ids):] == IGNORE_INDEX).all()  # padding is never trained
    assert packed.num_tokens == len(ids) and packed.real().flatten().tolist() == [True] * len(ids) + [False] * (
        packed.input_ids.numel() - len(ids))
    dropped = pack(enc, 64, tok.end_id)
    assert len(dropped) == len(ids) // 64
    assert dropped.input_ids.flatten().tolist() == ids[:len(dropped) * 64]


def test_pack_by_document_starts_each_document_a_block(docs, tok):
    enc = encode_documents(docs[:30], tok, "lmlm")
    packed = pack(enc, 48, tok.end_id, pad_id=tok.eos_id, by_document=True)
    assert len(packed) == sum(-(-len(e.input_ids) // 48) for e in enc) > len(enc)  # long ones take two blocks
    row = 0
    for e in enc:  # each document from the start of a block, every token kept, the rest untrained padding
        n = -(-len(e.input_ids) // 48)
        flat = packed.input_ids[row:row + n].flatten()
        assert flat[:len(e.input_ids)].tolist() == e.input_ids and flat[0] == tok.doc_id
        assert (packed.labels[row:row + n].flatten()[len(e.input_ids):] == IGNORE_INDEX).all()
        assert packed.real()[row:row + n].flatten().tolist() == [True] * len(e.input_ids) + [False] * (
            n * 48 - len(e.input_ids))  # its padding is no data, though real documents follow it
        assert packed.real_tokens(torch.arange(row, row + n)) == len(e.input_ids)
        row += n
    assert packed.num_tokens == sum(len(e.input_ids) for e in enc)
    stream = pack(enc, 48, tok.end_id, pad_id=tok.eos_id)  # the same trained targets, in other blocks
    assert (packed.labels != IGNORE_INDEX).sum() >= (stream.labels != IGNORE_INDEX).sum() - len(stream)


@pytest.mark.parametrize("how", ["by_document", "fit"])
def test_documents_packed_apart_are_taught_where_they_end(docs, tok, how):
    enc = encode_documents(docs[:20], tok, "lmlm")
    seq_len = 2 * max(len(e.input_ids) for e in enc)  # every document fits a block
    packed = pack(enc, seq_len, tok.end_id, pad_id=tok.eos_id, eod_id=tok.eos_id, **{how: True})
    assert packed.num_tokens == sum(len(e.input_ids) + 1 for e in enc)
    targets, flat = packed.targets()[0], packed.input_ids.flatten().tolist()
    for e in enc:  # each document whole somewhere, its last token taught that the document ends there
        at = next(k for k in range(len(flat)) if flat[k:k + len(e.input_ids)] == e.input_ids)
        r, c = divmod(at + len(e.input_ids) - 1, seq_len)
        assert targets[r, c] == tok.eos_id
    assert int((targets == tok.eos_id).sum()) == len(enc)
    plain = pack(enc, seq_len, tok.end_id, pad_id=tok.eos_id, **{how: True})  # without it no end is taught
    assert int((plain.targets()[0] == tok.eos_id).sum()) == 0


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_pack_fit_shares_blocks_without_padding_and_each_document_sees_only_itself(docs, tok, preset):
    from lmlm.models import ModelConfig, build_model
    from lmlm.train.loop import lm_loss_sum

    enc = encode_documents(docs[:40], tok, "lmlm")
    lengths = [len(e.input_ids) for e in enc]
    seq_len = 2 * max(lengths)  # every document fits a block, and any two share one
    model = build_model(ModelConfig.from_name(preset, context_length=seq_len), len(tok), tok, seed=0).eval()
    alone = pack(enc, seq_len, tok.end_id, pad_id=tok.eos_id, by_document=True)
    fit = pack(enc, seq_len, tok.end_id, pad_id=tok.eos_id, fit=True)
    assert len(alone) == len(enc) and len(fit) < len(enc) * 0.6
    assert fit.num_tokens == alone.num_tokens == sum(lengths)
    assert 1 - fit.num_tokens / fit.input_ids.numel() < 0.5 * (1 - alone.num_tokens / alone.input_ids.numel())
    # every document is in one block whole, its positions from 0, its padding-free tokens first
    starts = (fit.position_ids == 0) & fit.real()
    assert int(starts.sum()) == len(enc) and (fit.input_ids[starts] == tok.doc_id).all()
    assert fit.real_tokens(torch.arange(len(fit))) == fit.num_tokens
    # the same trained targets, and the same loss: a document packed beside another sees only itself
    t_alone, t_fit = alone.targets()[0], fit.targets()[0]
    assert (t_fit != IGNORE_INDEX).sum() == (t_alone != IGNORE_INDEX).sum()
    with torch.no_grad():
        want = lm_loss_sum(model, alone.input_ids, t_alone)
        got = lm_loss_sum(model, fit.input_ids, t_fit, fit.position_ids)
        blind = lm_loss_sum(model, fit.input_ids, t_fit)  # without the positions, documents read each other
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    assert not torch.isclose(blind, want, rtol=1e-4, atol=1e-3)


def test_labels_mask_exactly_values_and_db_end(docs, tok):
    enc = encode_documents(docs[:30], tok, "lmlm")
    packed = pack(enc, 64, tok.end_id)
    ids, roles, labels = packed.input_ids, packed.roles, packed.labels
    masked = labels == IGNORE_INDEX
    assert torch.equal(masked, (roles == VALUE) | (ids == tok.end_id))
    assert torch.equal(labels[~masked], ids[~masked])
    assert ((ids == tok.end_id) <= (roles == CALL)).all()
    assert (roles == VALUE).sum() > 0 and (ids == tok.end_id).sum() == (ids == tok.start_id).sum()
    # the shifted targets are the labels of the next position
    targets, target_roles = packed.targets()
    assert torch.equal(targets[:, :-1], labels[:, 1:]) and (targets[:, -1] == IGNORE_INDEX).all()
    assert torch.equal(target_roles[:, :-1], roles[:, 1:])


def test_read_documents_jsonl_and_txt(tmp_path):
    texts = biographies(3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "a.txt").write_text("\n".join(texts) + "\n\n")
    expected = [parse(t).segments for t in texts]
    segments = [[d.segments for d in read_documents(tmp_path / f)] for f in ("a.jsonl", "a.txt")]
    assert segments[0] == segments[1] == expected


def test_block_order_is_a_seeded_permutation_per_epoch():
    b = _Batches(num_blocks=10, batch_size=4, seed=1)
    assert b.steps_per_epoch == 2
    epoch0 = torch.cat([b(0), b(1)])
    assert len(set(epoch0.tolist())) == 8
    assert torch.equal(b(0), _Batches(10, 4, 1)(0)) and not torch.equal(b(0), _Batches(10, 4, 2)(0))
    assert not torch.equal(b(2), b(0))  # a new permutation in the next epoch


def test_learning_rate_schedule():
    cfg = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert learning_rate(0, cfg, 110) == pytest.approx(0.1)
    assert learning_rate(9, cfg, 110) == pytest.approx(1.0)
    assert learning_rate(60, cfg, 110) == pytest.approx(0.55)
    assert learning_rate(110, cfg, 110) == pytest.approx(0.1)
    assert learning_rate(60, TrainConfig(lr=1.0, warmup_steps=10, schedule="constant"), 110) == 1.0


def test_config_validation():
    with pytest.raises(ValueError, match="mode"):
        TrainConfig(mode="rag")
    with pytest.raises(ValueError, match="max_steps or epochs"):
        TrainConfig(max_steps=3, epochs=1)
    with pytest.raises(ValueError, match="unknown field"):
        TrainConfig.from_dict({"learning_rate": 1.0})
    import importlib.util

    # a tracker whose package is missing: Accelerate only warns and logs nowhere, so the config refuses it
    missing = next(t for t in ("swanlab", "trackio", "dvclive", "aim", "clearml", "tensorboard", "wandb")
                   if importlib.util.find_spec(t) is None)
    with pytest.raises(ValueError, match=f"report_to {missing}: the {missing} package is not installed"):
        TrainConfig(report_to=[missing])


# -- training -------------------------------------------------------------------------------------

def test_tiny_model_learns_and_saves_a_checkpoint(tmp_path, docs, tok):
    held_out = [parse(t).segments for t in biographies(20, seed=99)]
    cfg = _config(tmp_path, max_steps=40, eval_every=20)
    result = train(cfg, docs, tok, eval_documents=held_out)
    losses = _losses(cfg.out_dir)
    assert len(losses) == 40 and losses[0] > 5.0
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5
    stats = result.stats
    assert stats["steps"] == 40 and stats["completed"] and stats["final_loss"] == losses[-1]
    assert stats["block_tokens"] == 40 * 8 * 64 and 0 < stats["trained_tokens"] < stats["tokens"]
    assert 0.95 * stats["block_tokens"] < stats["tokens"] <= stats["block_tokens"]  # the stream's last block: padded
    assert stats["parameters"]["total"] == sum(p.numel() for p in result.model.parameters())
    assert stats["eval"]["loss"] < losses[0] and {"loss_org", "loss_entity", "loss_value"} <= set(stats["eval"])

    out = Path(cfg.out_dir)
    resolved = json.loads((out / "train_config.json").read_text())
    assert resolved["train"]["grad_accum"] == 2 and resolved["model"]["hidden_size"] == 64
    model, tokenizer, meta = load_checkpoint(out / "checkpoint")
    assert meta["mode"] == "lmlm" and meta["stats"]["steps"] == 40
    assert AutoModelForCausalLM.from_pretrained(str(out / "checkpoint")) is not None
    packed = pack(encode_documents(held_out, tokenizer), 64, tokenizer.end_id, pad_id=tokenizer.eos_id)
    assert evaluate_loss(model, packed)["loss"] == pytest.approx(stats["eval"]["loss"], rel=1e-5)


def test_standard_baseline_trains_on_stripped_text(tmp_path, docs, tok):
    result = train(_config(tmp_path, mode="standard", model="llama-tiny", max_steps=4), docs, tok)
    resolved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    standard_tokens = sum(len(e) for e in encode_documents(docs, tok, "standard"))
    assert resolved["data_trained_tokens"] == standard_tokens
    assert result.stats["steps"] == 4 and result.stats["final_loss"] > 0


def test_init_from_starts_at_a_checkpoint(tmp_path, docs, tok):
    """Fine-tuning (TOFU after pretraining): step 0 of the new run sees the checkpoint's weights."""
    first = train(_config(tmp_path, "pre", max_steps=6), docs, tok)
    zero = train(_config(tmp_path, "zero", max_steps=1, lr=1e-12, warmup_steps=1,
                         init_from=str(tmp_path / "pre" / "checkpoint")), docs, tok)
    for a, b in zip(first.model.parameters(), zero.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="init_from"):
        train(_config(tmp_path, "other", model="llama-tiny", init_from=str(tmp_path / "pre" / "checkpoint")), docs, tok)


def test_loss_is_the_mean_over_trained_tokens_of_the_global_batch(tmp_path, docs, tok):
    """One micro-batch of 8 or two accumulated micro-batches of 4: the same steps (values are masked
    unevenly across micro-batches, so a mean of micro-batch means would differ)."""
    train(_config(tmp_path, "a", micro_batch_size=8), docs, tok)
    train(_config(tmp_path, "b", micro_batch_size=4), docs, tok)
    torch.testing.assert_close(_losses(tmp_path / "a"), _losses(tmp_path / "b"), rtol=1e-5, atol=0)


def test_resume_continues_exactly(tmp_path, docs, tok):
    straight = train(_config(tmp_path, "straight"), docs, tok).stats
    first = train(_config(tmp_path, "split", stop_step=4), docs, tok).stats
    assert first["steps"] == 4 and not first["completed"]
    # a run killed after step 6 but saved at step 4 has logged steps 5 and 6, which the resumed run repeats
    log = tmp_path / "split" / "train_log.jsonl"
    log.write_text(log.read_text() + "".join(x for x in (tmp_path / "straight" / "train_log.jsonl").read_text()
                                             .splitlines(True) if json.loads(x)["step"] in (5, 6)))
    resumed = train(_config(tmp_path, "split", resume=True), docs, tok).stats
    assert resumed["steps"] == 8 and resumed["trained_tokens"] == straight["trained_tokens"]
    # the same batches, weights, optimizer moments and RNG: bit-identical on one process
    assert resumed["final_loss"] == straight["final_loss"]
    assert _losses(tmp_path / "split") == _losses(tmp_path / "straight")


def test_resume_refuses_a_changed_recipe(tmp_path, docs, tok):
    train(_config(tmp_path, stop_step=2), docs, tok)
    with pytest.raises(ValueError, match="train.lr"):
        train(_config(tmp_path, resume=True, lr=1e-2), docs, tok)


def test_max_seconds_stops_and_saves_state(tmp_path, docs, tok):
    stats = train(_config(tmp_path, max_steps=10_000, max_seconds=0.5), docs, tok).stats
    assert 0 < stats["steps"] < 10_000 and not stats["completed"]
    state = json.loads((tmp_path / "run" / "state" / "trainer_state.json").read_text())
    assert state["step"] == stats["steps"]


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, docs, tok):
    """``torchrun --nproc_per_node 2`` (gloo, CPU) with the same global batch takes the same steps.

    The two processes split each global batch of 8 into halves of 4 and DDP averages their
    gradients; one process accumulates the same halves. Scaling by 2 and averaging over 2 is exact
    in floating point and a sum of two terms does not depend on their order, so the losses agree to
    the last bit here; the tolerance (1e-6 relative) only allows for all-reduce implementations
    that sum in another precision.
    """
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in biographies(240)))
    tok.save(tmp_path / "tok")
    cfg = _config(tmp_path, max_steps=6, micro_batch_size=4).to_dict()
    cfg.update(data=str(data), tokenizer=str(tmp_path / "tok"))
    for name in ("one", "two"):
        (tmp_path / f"{name}.json").write_text(json.dumps({**cfg, "out_dir": str(tmp_path / name)}))
    main(["--config", str(tmp_path / "one.json")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "lmlm.train", "--config", str(tmp_path / "two.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["num_processes"] == 2 and stats["steps"] == 6
    torch.testing.assert_close(_losses(tmp_path / "two"), _losses(tmp_path / "one"), rtol=1e-6, atol=0)


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path, docs, tok):
    eager = train(_config(tmp_path, "eager", max_steps=4), docs, tok).stats
    compiled = train(_config(tmp_path, "compiled", max_steps=4, compile=True), docs, tok).stats
    assert compiled["final_loss"] == pytest.approx(eager["final_loss"], rel=1e-4)


def test_every_train_preset_loads_and_an_unknown_one_is_named():
    from lmlm.train import TRAIN_PRESETS, TrainConfig, TrainConfigError

    for name in TRAIN_PRESETS:
        cfg = TrainConfig.from_name(name, out_dir="runs/x")
        assert cfg.model and cfg.max_steps and cfg.out_dir == "runs/x"
    with pytest.raises(TrainConfigError, match="unknown train preset 'nope'"):
        TrainConfig.from_name("nope")
    with pytest.raises(TrainConfigError, match="lr"):
        TrainConfig.from_name("demo", lr=-1.0)


@pytest.mark.slow
def test_ctrl_c_stops_after_the_step_with_the_state_saved_and_resume_goes_on(tmp_path, tok):
    """``lmlm train`` interrupted by Ctrl-C: the step under way ends, the state is saved, exit 130 with
    the command to go on; ``--resume`` then finishes the run from there."""
    import signal
    import time

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in biographies(240)))
    tok.save(tmp_path / "tok")
    args = [sys.executable, "-m", "lmlm.cli", "train", "--data", str(data), "--tokenizer", str(tmp_path / "tok"),
            "--model", "gpt2-tiny", "--seq-len", "64", "--batch-size", "8", "--max-steps", "400",
            "--log-every", "1", "--threads", "1", "--no-progress", "--out", str(tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "train_log.jsonl"
    deadline = time.time() + 120
    while not (log.exists() and log.read_text().count("\n") >= 3) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "the state is saved" in err and "--resume" in err and "Traceback" not in err
    saved = json.loads((tmp_path / "run" / "state" / "trainer_state.json").read_text())["step"]
    assert saved >= 3 and json.loads(out.strip().splitlines()[-1])["steps"] == saved
    assert saved < 400, "the run ended before it was interrupted"
    done = subprocess.run(args + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["steps"] == 400


def test_a_new_run_replaces_the_older_run_in_its_folder(tmp_path, tok):
    """A new run in a folder holding a finished run, killed before it saved a state: nothing of the older
    run is left (no checkpoint, no state for --resume to pick up); --resume then starts from step 0."""
    import signal
    import time

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in biographies(240)))
    tok.save(tmp_path / "tok")
    args = [sys.executable, "-m", "lmlm.cli", "train", "--data", str(data), "--tokenizer", str(tmp_path / "tok"),
            "--model", "gpt2-tiny", "--seq-len", "64", "--batch-size", "8", "--log-every", "1", "--threads", "1",
            "--no-progress", "--out", str(tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    old = subprocess.run(args + ["--max-steps", "6", "--save-every", "3"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert old.returncode == 0, old.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoint").exists() and (tmp_path / "run" / "state").exists()
    new = args + ["--max-steps", "100000", "--lr", "0.002"]  # killed long before its end (no state saved)
    log = tmp_path / "run" / "train_log.jsonl"
    old_lines = log.read_text().splitlines()
    proc = subprocess.Popen(new, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:  # the new run has logged two steps (its first, at another lr, is not the old one's)
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= 2 and lines[0] != old_lines[0]:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert time.time() < deadline, err[-2000:]
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / "state").exists()
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["train"]["lr"] == 0.002
    resumed = subprocess.run(new + ["--resume", "--max-seconds", "1"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "no saved training state to resume" in resumed.stderr and "starts from step 0" in resumed.stderr
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines() if '"loss"' in x]
    assert steps == list(range(1, len(steps) + 1))  # the new run's steps from 1, none of the older run's


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_lora_trains_an_adapter_and_the_lookup_rows_and_saves_a_plain_model(tmp_path, docs, tok, preset):
    """--lora R: the base weights stay, a low-rank update of every linear layer and the four lookup
    tokens' rows are trained, and the checkpoint is the merged model, loaded as any other."""
    from transformers import AutoModelForCausalLM

    base = train(_config(tmp_path, "pre", model=preset, max_steps=4), docs, tok)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    run = train(_config(tmp_path, "lora", model=preset, max_steps=6, lora=4, freeze_layers=1,
                        init_from=str(tmp_path / "pre" / "checkpoint")), docs, tok)
    stats = run.stats
    assert 0 < stats["trainable_parameters"] < 0.5 * stats["parameters"]["total"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "lora" / "checkpoint")
    after = loaded.state_dict()
    assert set(after) == set(before)  # no adapter left: merged into the weights
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    emb = loaded.get_input_embeddings().weight
    rows = (emb != before[next(k for k in before if before[k].shape == emb.shape)]).any(dim=1).nonzero().flatten()
    assert sorted(rows.tolist()) == sorted(tok.call_ids)  # only the lookup tokens' rows moved
    layer0 = {k for k in changed if ".0." in k}
    assert not layer0, f"frozen layer 0 changed: {sorted(layer0)}"
    assert any(".1." in k for k in changed)  # the layer above it was adapted
    assert not any("norm" in k or k.endswith(".bias") or "ln_" in k for k in changed)
    with torch.no_grad():  # the saved model is the trained one
        ids = torch.tensor([encode_documents(docs[:1], tok, "lmlm")[0].input_ids[:32]])
        torch.testing.assert_close(loaded(ids).logits, run.model(ids).logits, rtol=1e-4, atol=1e-4)


def test_lora_needs_a_pretrained_start(tmp_path):
    with pytest.raises(ValueError, match="lora 4 adapts a pretrained model; give init_from"):
        _config(tmp_path, lora=4)


def test_the_heads_lookup_rows_train_as_peft_trains_them_without_a_whole_vocabulary_gradient(tok):
    """A tied output head whose four lookup rows train: the same logits and gradients as PEFT's own
    trainable-token layer, and a backward pass that computes no gradient for the frozen rows (counted
    in FLOPs: one vocabulary-sized matrix product a token fewer)."""
    import copy

    from peft import LoraConfig, get_peft_model
    from tiny_lm import tiny_gpt2
    from torch.utils.flop_counter import FlopCounterMode

    from lmlm.train.lora import add_lora, lora_targets

    torch.manual_seed(0)
    model = tiny_gpt2(tok)
    ids = sorted(tok.call_ids)
    ours = add_lora(copy.deepcopy(model), r=4, new_token_ids=ids)
    theirs = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=4, lora_alpha=8, target_modules=lora_targets(model), fan_in_fan_out=True, task_type="CAUSAL_LM",
        trainable_token_indices={"wte": ids}))
    trained = dict(theirs.named_parameters())
    with torch.no_grad():  # the same trained state in both: rows and adapters away from their start
        for n, p in ours.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
                trained[n].copy_(p)
    ours.eval(), theirs.eval()  # no dropout: the two passes see the same network
    batch = torch.randint(0, len(tok), (2, 24))
    batch[:, 5] = ids[0]  # a lookup token read as input, and predicted
    flops, grads, logits = {}, {}, {}
    for name, m in (("ours", ours), ("theirs", theirs)):
        with FlopCounterMode(display=False) as count:
            out = m(batch, labels=batch)
            out.loss.backward()
        flops[name], logits[name] = count.get_total_flops(), out.logits.detach()
        grads[name] = {n: p.grad for n, p in m.named_parameters() if p.requires_grad}
    torch.testing.assert_close(logits["ours"], logits["theirs"])
    assert set(grads["ours"]) == set(grads["theirs"]) and len(grads["ours"]) > 4
    for n in grads["ours"]:
        torch.testing.assert_close(grads["ours"][n], grads["theirs"][n], rtol=1e-4, atol=1e-6)
    vocab, width, tokens = len(tok), model.config.n_embd, batch.numel()
    assert flops["theirs"] - flops["ours"] >= 0.9 * 2 * vocab * width * tokens
