"""Prompts: our instructions, few-shot examples picked from the corpus, answers cleaned of decoration."""

from lmlm.annotate.prompts import DEFAULT_EXAMPLE, INSTRUCTIONS, build_messages, extract_annotation, select_examples
from lmlm.annotate.validate import validate
from lmlm.worlds.bios import BiosWorld


def test_examples_come_from_the_corpus():
    world = BiosWorld.generate("smoke")
    docs = [d.annotated for d in world.train_documents] + ["[dblookup('broken"]
    examples = select_examples(docs, k=3, max_chars=400)
    assert len(examples) == 3 and len({validate(e.text, e.annotated).kept[0].entity for e in examples}) == 3
    for e in examples:
        v = validate(e.text, e.annotated)
        assert not v.rejected and len(e.text) <= 400 and e.annotated in docs
    messages = build_messages("Some passage.", examples)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert messages[0]["content"] == INSTRUCTIONS and messages[-1]["content"] == "Some passage."


def test_default_example_is_valid_and_answers_are_cleaned():
    v = validate(DEFAULT_EXAMPLE.text, DEFAULT_EXAMPLE.annotated)
    assert len(v.kept) == 7 and not v.rejected
    assert build_messages("x")[1]["content"] == DEFAULT_EXAMPLE.text
    assert extract_annotation("```text\nAda [dblookup('A', 'B') -> C] C\n```") == "Ada [dblookup('A', 'B') -> C] C"
    assert extract_annotation("Annotated passage: Ada was here.") == "Ada was here."
