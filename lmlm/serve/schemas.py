"""Request and response bodies of ``lmlm serve``, with the server's limits written into the schema.

Request models are built per app by :func:`request_models` so that ``/docs`` and the OpenAPI schema
state the limits the server enforces (longest prompt, most new tokens, ...). Response models are
fixed. Every string must be valid UTF-8 (no lone surrogates): the tokenizer and SQLite need it.
"""


from types import SimpleNamespace
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from .limits import ServeLimits

__all__ = ["ServeLimits", "request_models", "MAX_ID"]

MAX_ID = 2**63 - 1  # SQLite integers are signed 64-bit


def utf8_text(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the string is not valid UTF-8 (it holds a lone surrogate)") from None
    return s


def _utf8_text(min_length: int = 0, max_length: int | None = None):
    """UTF-8 text of a bounded length: a lone surrogate is named before the string is read, and the
    bounds are the string's own, so that a 422 speaks of characters ("at least 1 character")."""
    check = BeforeValidator(lambda s: utf8_text(s) if isinstance(s, str) else s)
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length), check]


Id = Annotated[int, Field(ge=1, le=MAX_ID)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "5" is no int, "yes" no bool: a 422


def request_models(limits: ServeLimits) -> SimpleNamespace:
    """The request bodies, with ``limits`` as their constraints."""
    L = limits
    Prompt = _utf8_text(1, L.max_prompt_chars)
    Name = _utf8_text(1, L.max_field_chars)
    Why = _utf8_text(0, L.max_field_chars)
    default_new = min(64, L.max_new_tokens)

    class GenerateRequest(_Strict):
        """One prompt to continue, looking facts up in the KB."""

        prompt: Prompt = Field(examples=["Ada Lind was born in"])
        max_new_tokens: int = Field(default_new, ge=1, le=L.max_new_tokens,
                                    description="generated tokens, forced value tokens included")
        force_lookup: bool = Field(False, description="open a lookup call at the end of the prompt")
        use_db: bool = Field(True, description="false: the no-database ablation (lookup tokens banned)")
        do_sample: bool = False
        temperature: float = Field(1.0, gt=0, le=10)
        top_p: float = Field(1.0, gt=0, le=1)
        top_k: int = Field(0, ge=0, le=1000)
        repetition_penalty: float = Field(1.0, gt=0, le=10, description="> 1 discourages repeats (FActScore's "
                                                                          "biographies: 1.2), as `lmlm generate`'s")
        seed: Optional[Seed] = Field(None, description="a seeded request runs in a batch of its own")
        max_lookups: Optional[int] = Field(None, ge=0, le=L.max_new_tokens,
                                           description="calls the continuation may open (default: the server's, "
                                                       "`lmlm serve --max-lookups`)")
        num_beams: int = Field(1, ge=1, le=L.max_beams, description="beam search (the best beam is returned); "
                                                                    "not with do_sample or stream")
        stream: bool = Field(False, description="answer with server-sent events: token*, result, done")

        @model_validator(mode="after")
        def _consistent(self):
            if self.force_lookup and not self.use_db:
                raise ValueError("force_lookup needs use_db")
            if self.force_lookup and self.max_lookups == 0:
                raise ValueError("force_lookup opens a call: it needs max_lookups >= 1")
            if self.num_beams > 1 and (self.do_sample or self.stream):
                raise ValueError(f"num_beams={self.num_beams} is beam search, which returns its best beam at the "
                                 f"end: not with {'do_sample' if self.do_sample else 'stream'}")
            return self

    class CompletionRequest(BaseModel):
        """OpenAI's legacy completions request; unknown OpenAI fields are accepted and ignored."""

        model_config = ConfigDict(extra="ignore", strict=True)
        model: Optional[_utf8_text(0, L.max_field_chars)] = None
        prompt: Union[Prompt, Annotated[list[Prompt], Field(min_length=1, max_length=L.max_prompts)]]
        max_tokens: int = Field(16, ge=1, le=L.max_new_tokens)
        temperature: float = Field(1.0, ge=0, le=2, description="0: greedy decoding")
        top_p: float = Field(1.0, gt=0, le=1)
        n: int = Field(1, ge=1, le=L.max_prompts)
        stream: bool = False
        stop: Optional[Union[_utf8_text(1, 64),
                             Annotated[list[_utf8_text(1, 64)],
                                       Field(max_length=4)]]] = None
        seed: Optional[Seed] = None
        echo: bool = False
        user: Optional[_utf8_text(0, L.max_field_chars)] = None
        force_lookup: bool = Field(False, description="lmlm: open a lookup call at the end of the prompt")

        @model_validator(mode="after")
        def _few_prompts(self):
            k = (len(self.prompt) if isinstance(self.prompt, list) else 1) * self.n
            if k > L.max_prompts:
                raise ValueError(f"prompts x n = {k} exceeds the limit of {L.max_prompts}")
            return self

    class NewTriple(_Strict):
        entity: Name
        relation: Name
        value: Name
        source: Optional[Name] = Field(None, description="id of the document the fact comes from")

    class AddRequest(_Strict):
        """Facts to add, as one new KB version."""

        triples: list[NewTriple] = Field(min_length=1, max_length=L.max_write_items)
        who: Name = "api"
        why: Why = ""

    class EditRequest(_Strict):
        """Make ``value`` the only active value of (entity, relation)."""

        entity: Name
        relation: Name
        value: Name
        who: Name = "api"
        why: Why = ""

    class DeleteRequest(_Strict):
        """Delete the active facts matching every filter given (at least one)."""

        triple_ids: Optional[list[Id]] = Field(None, min_length=1, max_length=L.max_write_items)
        entity: Optional[Name] = None
        relation: Optional[Name] = None
        source: Optional[Name] = None
        who: Name = "api"
        why: Why = ""

        @model_validator(mode="after")
        def _some_filter(self):
            if self.triple_ids is None and self.entity is None and self.relation is None and self.source is None:
                raise ValueError("say what to delete: triple_ids, entity, relation or source")
            return self

    class RestoreRequest(_Strict):
        """Make the active facts and aliases those of a past version, as new versions."""

        version: int = Field(ge=0, le=MAX_ID)
        who: Name = "api"
        why: Why = ""

    class ForgetRequest(_Strict):
        """A forget set: every active fact of these entities, these sources and these ids, deleted as
        one version."""

        entities: list[Name] = Field(default_factory=list, max_length=L.max_write_items)
        sources: list[Name] = Field(default_factory=list, max_length=L.max_write_items)
        triple_ids: list[Id] = Field(default_factory=list, max_length=L.max_write_items)
        who: Name = "api"
        why: Why = ""

        @model_validator(mode="after")
        def _not_empty(self):
            if not (self.entities or self.sources or self.triple_ids):
                raise ValueError("the forget set is empty: give entities, sources or triple_ids")
            return self

    return SimpleNamespace(GenerateRequest=GenerateRequest, CompletionRequest=CompletionRequest,
                           AddRequest=AddRequest, EditRequest=EditRequest, DeleteRequest=DeleteRequest,
                           ForgetRequest=ForgetRequest, RestoreRequest=RestoreRequest, Name=Name)


# -- responses ------------------------------------------------------------------------------------

class TraceOut(BaseModel):
    """One lookup made while generating."""

    query_entity: str
    query_relation: str
    matched_entity: Optional[str]
    matched_relation: Optional[str]
    value: str
    score: Optional[float]
    triple_id: Optional[int]
    sources: list[str]
    kb_version: Optional[int]
    found: bool
    status: Optional[str] = Field(None, description="exact, fuzzy, fallback, unfinished, ... (when known)")
    problem: Optional[str] = None
    via: Optional[str] = Field(None, description="how the entity was found: exact, alias, context, fuzzy; "
                                                 "key under the paper's single-key match")
    miss_reason: Optional[str] = Field(None, description="why nothing was found: no_entity, ambiguous_entity, "
                                                         "no_relation or below_threshold")
    miss_detail: Optional[str] = None
    candidates: list[tuple[str, float]] = Field(default_factory=list, description="what the KB considered on a miss")


class SegmentOut(BaseModel):
    """A piece of the output: plain text, or a lookup call with the index of its trace entry."""

    type: Literal["text", "lookup"]
    text: Optional[str] = None
    entity: Optional[str] = None
    relation: Optional[str] = None
    value: Optional[str] = None
    trace: Optional[int] = None


class GenerateResponse(BaseModel):
    prompt: str
    text: str = Field(description="with lookups as [dblookup('E', 'R') -> V]")
    clean_text: str = Field(description="lookups removed")
    segments: list[SegmentOut]
    trace: list[TraceOut]
    problems: list[str]
    kb_version: int = Field(description="the KB version when the request finished")
    prompt_tokens: int
    tokens: int = Field(description="generated tokens, forced value tokens included")
    finish_reason: Literal["stop", "length"]
    batch_rows: int = Field(description="prompts decoded in the same batch")
    queued_s: float
    run_s: float


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"]
    lmlm: dict = Field(description="lmlm extension: the annotated text and the lookup trace")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class MatchOut(BaseModel):
    entity: str
    relation: str
    value: str
    score: float
    triple_id: int
    exact: bool
    sources: list[str]
    version: int
    alternatives: int


class MissOut(BaseModel):
    """Why a lookup found nothing."""

    reason: str = Field(description="no_entity, ambiguous_entity, no_relation or below_threshold")
    detail: str
    entity: Optional[str] = None
    candidates: list[tuple[str, float]] = Field(default_factory=list)


class LookupResponse(BaseModel):
    match: Optional[MatchOut]
    miss: Optional[MissOut] = None
    version: int


class SearchResponse(BaseModel):
    matches: list[MatchOut]
    version: int


class TripleOut(BaseModel):
    id: int
    entity: str
    relation: str
    value: str
    count: int
    created_version: int
    deleted_version: Optional[int]
    active: bool
    sources: list[tuple[str, Optional[int]]]


class VersionOut(BaseModel):
    version: int
    time: str
    who: str
    why: str
    op: str
    n_changed: int


class ChangeOut(BaseModel):
    version: int
    triple_id: int
    op: str
    old_value: Optional[str]
    new_value: Optional[str]


class LogResponse(BaseModel):
    versions: list[VersionOut]
    version: int


class AliasOut(BaseModel):
    alias: str
    entity: str


class VersionDetail(BaseModel):
    record: VersionOut
    changes: list[ChangeOut] = Field(description="what the version did to each triple it touched")
    aliases_added: list[AliasOut] = Field(default_factory=list, description="other names of entities it added")
    aliases_removed: list[AliasOut] = Field(default_factory=list, description="and deleted (with an entity's "
                                                                              "last fact, or by name)")


class KBVersion(BaseModel):
    version: int
    triples: int


class WriteResponse(BaseModel):
    version: int = Field(description="the KB version after the write")
    changed: int = Field(description="triples added, edited or deleted (0: the KB did not change)")


class Problem(BaseModel):
    detail: Union[str, list, dict]
