"""Linear layers run through weights laid out for oneDNN (``lmlm.generate.packed``): the same logits as
the layers' own forward, training untouched, never a stale copy after the weights change, and the
same generations from a trained model in bfloat16. On a CPU whose oneDNN has no bfloat16 kernels
(AVX2 only; ``ONEDNN_MAX_CPU_ISA=AVX2`` makes one of any x86 CPU) bfloat16 layers take their own
``forward`` and no copy is made: the same tests then assert that fallback."""

from __future__ import annotations

import copy

import pytest
import torch
from gen_support import bio_prompts

from lmlm.generate import LookupGenerator
from lmlm.generate.packed import pack_linears, packed_copies, packing, packing_available
from lmlm.models import build_model

pytestmark = pytest.mark.skipif(not packing_available(), reason="this PyTorch is built without oneDNN")

VOCAB = 300
BF16 = packing_available(torch.bfloat16)  # oneDNN has bfloat16 kernels for this CPU


def _pair(name: str):
    """A bfloat16 model of preset ``name`` and a copy of it left unpacked."""
    model = build_model(name, VOCAB, seed=0, dtype=torch.bfloat16).eval()
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_packed_logits_equal_the_layers_own(name):
    packed, plain = _pair(name)
    assert pack_linears(packed) == sum(1 for m in packed.modules() if m.__class__.__name__ in ("Linear", "Conv1D"))
    x = torch.randint(0, VOCAB, (3, 21), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = plain(input_ids=x).logits, packed(input_ids=x).logits
        assert packed_copies(packed) == (pack_linears(packed) if BF16 else 0)
        with packing(False):  # the layers' own forward again
            assert torch.equal(packed(input_ids=x).logits, want)
    if not BF16:  # no bfloat16 kernels here: the layers' own forward, bit for bit
        assert torch.equal(got, want)
    elif name.startswith("llama"):  # nn.Linear: the same oneDNN kernel, bit for bit
        assert torch.equal(got, want)
    else:  # GPT-2's Conv1D stores its weight transposed: another kernel, bfloat16 rounding apart
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.05)
    assert not torch.equal(got, torch.zeros_like(got))


def test_training_takes_the_layers_own_forward_and_a_changed_weight_is_repacked():
    model, _ = _pair("llama-tiny")
    pack_linears(model)
    x = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(input_ids=x).logits  # makes the packed copies (where bfloat16 is packable)
    assert packed_copies(model) == (pack_linears(model) if BF16 else 0)
    model.train()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    head = model.lm_head.weight
    assert head.grad is not None and head.grad.abs().sum() > 0  # autograd went through the real weights
    torch.optim.SGD(model.parameters(), lr=1.0).step()  # changes every weight in place
    model.eval()
    with torch.no_grad():
        after = model(input_ids=x).logits
        reference = build_model("llama-tiny", VOCAB, dtype=torch.bfloat16).eval()
        reference.load_state_dict(model.state_dict())
        assert torch.equal(after, reference(input_ids=x).logits)  # no stale copy served
    assert not torch.equal(after, before)
    # float32: one or two rows go through the layers' own forward, a batch's 4-64 rows packed
    model.float(), reference.float()
    with torch.no_grad():
        assert torch.equal(model(input_ids=x[:1, :2]).logits, reference(input_ids=x[:1, :2]).logits)
        torch.testing.assert_close(model(input_ids=x).logits, reference(input_ids=x).logits)
    assert packed_copies(model) == pack_linears(model)  # float32 packs on every CPU with oneDNN


def test_generations_from_a_trained_model_in_bfloat16(world, kb):
    model = copy.deepcopy(world.model).to(torch.bfloat16)
    never = copy.deepcopy(model)
    prompts = bio_prompts(world, 16)
    runs = {}
    for name, gen in [("packed", LookupGenerator(model, world.tok, kb)),
                      ("unpacked", LookupGenerator(model, world.tok, kb, packed_weights=False)),  # same model
                      ("never", LookupGenerator(never, world.tok, kb, packed_weights=False))]:
        runs[name] = gen.generate(prompts, max_new_tokens=24, batch_size=8)
    found = [t for r in runs["packed"] for t in r.trace if t.found]
    runs = {name: [r.token_ids for r in results] for name, results in runs.items()}
    assert runs["unpacked"] == runs["never"]  # packed_weights=False holds on a model another generator packed
    assert runs["packed"] == runs["never"]  # a trained model's greedy choices survive the kernels' rounding
    assert len(found) >= 12  # the bfloat16 model still makes its lookups
    assert packed_copies(model) == (pack_linears(model) if BF16 else 0)
