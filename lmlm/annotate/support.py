"""Which distant-supervision facts a model can learn from: the kind of a value, the words before a call.

An infobox value found in the article text is not always the fact stated there: "Florida and the
Gulf of Mexico to the south" mentions Alabama's lowest point without saying so, and a model
trained on a call there learns to call for a relation the text gives no reason to ask about. The
authors' later release post-processes its annotations for the same reason. Two tests:

* :func:`fits_kind`: a value of its relation's kind. A population cut out of an infobox
  (``Largest City: 212,038``) is no city, a year no language; such a fact stays out of the KB and
  the text, as no text states it.
* :func:`stated_before`: the sentence before the mention says what the relation is (its own words,
  or the words a text uses for it: "born" for a birth place, "married" for a spouse, "capital" for
  the capital). Only such a mention gets a call: the model reads, at the call, why it is asking.

Exercised by ``lmlm annotate wikipedia DUMP --out DIR`` (``--all-mentions`` keeps every mention).
"""

from __future__ import annotations

import re

__all__ = ["fits_kind", "stated_before", "relation_cues", "CUES"]

# the words a text uses when it states a relation, beyond the relation's own name (stems: a word
# starting with one counts); the most frequent infobox fields of English Wikipedia
CUES: dict[str, tuple[str, ...]] = {
    "capital": ("capital", "seat of government"),
    "largest city": ("largest", "biggest", "most populous"),
    "official languages": ("language", "spoken", "speak", "official"),
    "recognised languages": ("language", "spoken", "speak", "recogni", "minority"),
    "national languages": ("language", "spoken", "speak", "national"),
    "languages": ("language", "spoken", "speak"),
    "language": ("language", "spoken", "speak", "written in"),
    "demonym": ("people", "citizen", "called", "known as", "nationals", "demonym"),
    "nationality": ("nationality", "citizen", "national"),
    "citizenship": ("citizen", "nationality"),
    "combatant": ("war", "fought", "against", "allied", "allies", "alliance", "enemy", "enemies", "side",
                  "forces", "invaded", "declared", "joined", "battle", "coalition"),
    "commander": ("command", "led", "leader", "general", "admiral", "under"),
    "battles": ("battle", "fought", "fight", "siege", "campaign", "war"),
    "notable works": ("wrote", "work", "book", "novel", "published", "author", "essay", "play", "poem", "written"),
    "known for": ("known", "famous", "noted", "work"),
    "influences": ("influence", "inspired", "follow", "student", "taught", "disciple", "read"),
    "influenced": ("influence", "inspired", "follow", "student", "taught"),
    "country": ("country", "nation", "located"),
    "operator": ("operat", "run by", "agency", "launched by", "program", "mission"),
    "party": ("party", "member", "elected", "candidate", "nominee", "democrat", "republican"),
    "abbreviation": ("abbreviat", "known as", "short", "called", "acronym"),
    "conventional long name": ("officially", "official name", "formally", "known as", "name"),
    "leader title": ("head of", "leader", "led by", "govern", "title"),
    "leader name": ("head of", "leader", "led by", "president", "prime minister", "king", "queen"),
    "strength": ("strength", "troops", "soldiers", "men", "force", "army", "numbered"),
    "established event": ("establish", "founded", "independ", "formed", "proclaim", "declared", "created"),
    "established date": ("establish", "founded", "independ", "formed", "since"),
    "work places": ("work", "taught", "professor", "university", "institute", "employed", "joined", "position"),
    "workplaces": ("work", "taught", "professor", "university", "institute", "employed", "joined", "position"),
    "alma mater": ("studied", "graduat", "attended", "educated", "university", "college", "school", "degree"),
    "legislature": ("legislat", "parliament", "assembly", "congress", "council", "elected"),
    "upper house": ("upper", "senate", "chamber", "house"),
    "lower house": ("lower", "chamber", "house", "assembly"),
    "birth date": ("born", "birth"),
    "birth place": ("born", "birth", "native"),
    "death date": ("died", "death", "killed", "until"),
    "death place": ("died", "death", "killed", "buried"),
    "spouse": ("married", "wife", "husband", "spouse", "wed"),
    "spouses": ("married", "wife", "husband", "spouse", "wed"),
    "partner": ("partner", "relationship", "married", "lived with"),
    "children": ("children", "son", "daughter", "child"),
    "siblings": ("brother", "sister", "sibling"),
    "parents": ("father", "mother", "parent", "son of", "daughter of"),
    "ethnicity": ("ethnic", "descent", "ancestry", "origin", "people"),
    "writer": ("written", "wrote", "writer", "script", "screenplay", "author"),
    "author": ("written", "wrote", "writer", "author", "written by"),
    "creator": ("created", "creator", "invented", "designed", "developed"),
    "director": ("directed", "director"),
    "starring": ("starring", "starred", "cast", "played", "actor", "actress", "role"),
    "state": ("state", "located"),
    "region": ("region", "located"),
    "launch date": ("launch", "lifted off", "liftoff"),
    "currency": ("currency", "money", "monetary"),
    "currency code": ("currency", "code"),
    "religion": ("religion", "faith", "church", "believ", "worship"),
    "population": ("population", "inhabitants", "people", "residents"),
    "awards": ("award", "prize", "won", "received", "honou", "medal"),
    "genre": ("genre", "style", "form"),
    "occupation": ("work", "career", "profession"),
}
_STOP = {"of", "the", "and", "a", "an", "in", "on", "for", "to", "by", "at", "name", "names", "other"}

# relations whose values are names or words, never bare numbers; and those whose values are dates
_WORDY = re.compile(r"city|capital|place|language|country|nation|demonym|party|spouse|religion|currency\b|"
                    r"author|writer|director|creator|operator|commander|combatant|leader name|state|region|"
                    r"alma mater|influence|starring|occupation|genre|ethnicity|citizenship", re.I)
_DATED = re.compile(r"\bdate\b|\bborn\b|\byear\b|date$", re.I)


def fits_kind(relation: str, value: str) -> bool:
    """Whether ``value`` is of the kind ``relation`` names: a name for a city or a language (not a
    number), a date with a digit in it for a date; anything for a relation of no known kind."""
    letters = sum(c.isalpha() for c in value)
    if _WORDY.search(relation) and not _DATED.search(relation) and letters < 2:
        return False
    if _DATED.search(relation) and not any(c.isdigit() for c in value):
        return False
    return True


def relation_cues(relation: str) -> tuple[str, ...]:
    """The words whose presence before a mention states ``relation``: its table entry, else its own words
    (not both: "city" alone does not state a largest city, "the city of [Birmingham]")."""
    key = " ".join(relation.lower().split())
    if key in CUES:
        return CUES[key]
    return tuple(w.rstrip("s")[:6] for w in re.findall(r"[a-z]+", key) if w not in _STOP and len(w) > 2)


_CLAUSE_BREAK = re.compile(r"[,;:]\s")


def stated_before(left: str, relation: str) -> bool:
    """Whether ``left``, the sentence up to a value's mention, says what ``relation`` the value is, in
    the clause the mention stands in (after the last comma, semicolon or colon): "a Turkic language,
    the early precursor of the [Azerbaijani]" does not state a language. A break right before the
    mention sets it beside the words before it ("the current Lt. Governor, [Kay Ivey]")."""
    text = " ".join(left.lower().split())
    cues = relation_cues(relation)

    def states(part: str) -> bool:
        return any(re.search(r"(?<![a-z])" + re.escape(cue), part) for cue in cues)

    breaks = [0] + [m.end() for m in _CLAUSE_BREAK.finditer(text + " ")]
    clause = text[breaks[-1]:]
    if clause.strip() or len(breaks) == 1:
        return states(clause)
    return states(text[breaks[-2]:breaks[-1]])  # an apposition: the clause before the break
