"""Lexical guards against the known false-hit traps of embedding similarity.

Sentence embeddings place "How do I enable two-factor auth?" and "How do I
disable two-factor auth?" close together (cosine ~0.9), and likewise "transfer
$50" / "transfer $500", "on Monday" / "on Friday", "my Visa card" / "my Amex
card". A guard compares the new query with the cached query it would be
answered from and vetoes the hit when they differ in one of these ways:

* ``negation``: opposite actions (antonym pairs such as enable/disable,
  lock/unlock) or negation on one side only (not, never, no, n't, cannot...).
* ``dates``: different dates, months, weekdays or relative days (today/tomorrow).
* ``numbers``: different numbers, amounts or percentages (date parts excluded).
* ``entities``: different capitalised names (not at sentence start).

Pure functions, regexes and word lists only: cheap enough for every would-be hit.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

GUARD_ORDER = ("negation", "dates", "numbers", "entities")

# Pairs of opposite actions; each side is a set of word stems (matched as prefixes
# of whole lower-cased words, so "enabled", "enabling" count as "enabl").
ANTONYM_PAIRS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("enabl",), ("disabl",)),
    (("activat",), ("deactivat",)),
    (("lock", "locked"), ("unlock",)),
    (("freez", "froze"), ("unfreez", "unfroz")),
    (("block",), ("unblock",)),
    (("subscrib",), ("unsubscrib",)),
    (("increas", "rais"), ("decreas", "lower", "reduc")),
    (("add", "added"), ("remov", "delet")),
    (("open", "opened"), ("clos",)),
    (("start", "begin", "began"), ("stop", "end", "cancel", "finish")),
    (("allow", "permit"), ("forbid", "prohibit", "deny", "denied", "disallow")),
    (("accept",), ("declin", "reject", "refus")),
    (("approv",), ("disapprov", "reject")),
    (("includ",), ("exclud",)),
    (("show",), ("hide", "hidden")),
    (("connect",), ("disconnect",)),
    (("link", "linked", "linking"), ("unlink",)),
    (("deposit",), ("withdraw",)),
    (("buy", "bought", "purchas"), ("sell", "sold")),
    (("upgrad",), ("downgrad",)),
    (("import",), ("export",)),
    (("min", "minimum", "lowest"), ("max", "maximum", "highest")),
    (("before",), ("after",)),
)
NEGATORS = frozenset({"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither",
                      "nor", "without", "cannot"})

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december")
MONTH_ABBR = {m[:3]: m for m in MONTHS if m != "may"} | {"sept": "september"}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
WEEKDAY_ABBR = {d[:3]: d for d in WEEKDAYS} | {"tues": "tuesday", "thur": "thursday", "thurs": "thursday"}
RELATIVE_DAYS = ("today", "tomorrow", "yesterday", "tonight", "weekend")
RELATIVE_PERIOD = re.compile(r"\b(next|last|this|previous)\s+(week|month|year|quarter)\b", re.I)

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_NUMERIC_DATE = re.compile(
    r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b|\b(\d{1,2})[/.](\d{1,2})(?:[/.](\d{2,4}))?\b")
_DAY_OF_MONTH = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)\b", re.I)
_YEAR = re.compile(r"\b(19\d{2}|20\d{2})\b")
_NUMBER = re.compile(r"(?<![\w.])[$€£¥]?\s?(\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)\s?(%|k\b|m\b|bn\b)?", re.I)
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())} | {
    "thirty": 30, "forty": 40, "fifty": 50, "hundred": 100, "thousand": 1000, "million": 10**6,
    "half": 0.5, "twice": 2, "once": 1, "double": 2, "single": 1}
_SCALE = {"%": 1.0, "k": 1e3, "m": 1e6, "bn": 1e9}
_CAP_TOKEN = re.compile(r"[A-Za-z][\w&'-]*")
_SENTENCE_END = re.compile(r"[.!?:;]\s*$")
# Capitalised words that are not names: the pronoun and common chat capitalisations.
_NOT_ENTITIES = frozenset({"i", "i'm", "i've", "i'd", "i'll", "ok", "okay", "hi", "hello", "hey",
                           "please", "thanks", "thank", "what", "how", "why", "when", "where",
                           "who", "which", "can", "could", "is", "are", "do", "does", "my", "the"})


def _normalise(text: str) -> str:
    text = text.translate(_APOSTROPHES)
    text = re.sub(r"\bcan't\b|\bcannot\b", "can not", text, flags=re.I)
    text = re.sub(r"\bwon't\b", "will not", text, flags=re.I)
    return re.sub(r"n't\b", " not", text, flags=re.I)


def _words(text: str) -> list[str]:
    return _WORD.findall(_normalise(text).lower())


# -- negation -----------------------------------------------------------------------

def _has_stem(words: list[str], stems: tuple[str, ...]) -> bool:
    return any(w.startswith(stem) for w in words for stem in stems)


def _side(words: list[str], left: tuple[str, ...], right: tuple[str, ...]) -> str:
    """Which action of a pair the words name: "left", "right", "both" or "none"."""
    has_right = _has_stem(words, right)
    # A left stem inside a right word ("block" in "unblock") does not count as left.
    has_left = any(w.startswith(stem) and not any(w.startswith(r) for r in right)
                   for w in words for stem in left)
    return {(True, True): "both", (True, False): "left", (False, True): "right"}.get(
        (has_left, has_right), "none")


# Negation on one side only vetoes when the rest of the wording is this similar
# (word-set Jaccard): "my card has not arrived" vs "my card has arrived" is the
# trap; "why hasn't my transfer arrived" vs "transfer still pending" asks the same.
NEGATION_OVERLAP = 0.5


def _overlap(a: list[str], b: list[str]) -> float:
    left, right = set(a) - NEGATORS, set(b) - NEGATORS
    return len(left & right) / max(len(left | right), 1)


def negation_conflict(query: str, cached: str) -> bool:
    """Opposite actions, or negation on one side only of otherwise similar wording."""
    a, b = _words(query), _words(cached)
    if bool(NEGATORS.intersection(a)) != bool(NEGATORS.intersection(b)) \
            and _overlap(a, b) >= NEGATION_OVERLAP:
        return True
    for left, right in ANTONYM_PAIRS:
        sides = {_side(a, left, right), _side(b, left, right)}
        if sides == {"left", "right"}:
            return True
    return False


# -- dates --------------------------------------------------------------------------

def date_mentions(text: str) -> set[str]:
    """Normalised date expressions: ISO/numeric dates, days of month, years, months,
    weekdays, relative days and periods."""
    found: set[str] = set()
    for m in _NUMERIC_DATE.finditer(text):
        parts = [p for p in m.groups() if p]
        found.add("date:" + "-".join(str(int(p)) for p in parts))
    found.update(f"day:{int(d)}" for d in _DAY_OF_MONTH.findall(text))
    found.update(f"year:{y}" for y in _YEAR.findall(text))
    # "May" the month: capitalised and not the sentence's first word (the modal verb
    # is far more common); abbreviations count only when capitalised ("Jan", "Fri").
    for m in re.finditer(r"[A-Za-z]+", text):
        raw, word = m.group(), m.group().lower()
        capital = raw[0].isupper()
        if word in MONTHS and (word != "may" or (capital and m.start() > 0)):
            found.add(f"month:{word}")
        elif word in MONTH_ABBR and capital:
            found.add(f"month:{MONTH_ABBR[word]}")
        if word in WEEKDAYS:
            found.add(f"weekday:{word}")
        elif word in WEEKDAY_ABBR and capital:
            found.add(f"weekday:{WEEKDAY_ABBR[word]}")
        if word in RELATIVE_DAYS:
            found.add(f"rel:{word}")
    found.update(f"period:{p.lower()}-{u.lower()}" for p, u in RELATIVE_PERIOD.findall(text))
    return found


def dates_conflict(query: str, cached: str) -> bool:
    """Different date expressions (one side having one the other lacks counts)."""
    return date_mentions(query) != date_mentions(cached)


# -- numbers ------------------------------------------------------------------------

def _strip_dates(text: str) -> str:
    for pattern in (_NUMERIC_DATE, _DAY_OF_MONTH, _YEAR):
        text = pattern.sub(" ", text)
    return text


def number_mentions(text: str) -> set[str]:
    """Normalised numbers (digits, amounts with currency or k/m suffix, percents, and
    number words), date parts excluded. A percent stays distinct from a plain number."""
    text = _strip_dates(text)
    found: set[str] = set()
    for m in _NUMBER.finditer(text):
        value = float(m.group(1).replace(",", ""))
        suffix = (m.group(2) or "").lower()
        if suffix in ("k", "m", "bn"):
            value *= _SCALE[suffix]
        found.add(f"{value:g}{'%' if suffix == '%' else ''}")
    for word in _words(text):
        if word in _NUMBER_WORDS:
            found.add(f"{_NUMBER_WORDS[word]:g}")
    if "percent" in text.lower() or "per cent" in text.lower():
        found = {n if n.endswith("%") else n + "%" for n in found}
    return found


def numbers_conflict(query: str, cached: str) -> bool:
    """Both mention numbers and they differ ("$50" vs "$500"). A number on one side
    only does not veto: on banking77 that cost 46 correct hits to remove 3 false
    ones at threshold 0.8 ("charged 1 euro extra" asks what "charged extra" asks)."""
    a, b = number_mentions(query), number_mentions(cached)
    return bool(a) and bool(b) and a != b


# -- named entities -----------------------------------------------------------------

def entity_mentions(text: str) -> set[str]:
    """Capitalised tokens that are not at a sentence start, plus all-caps acronyms
    anywhere, casefolded. Texts written mostly in capitals carry no signal: empty."""
    tokens = [(m.group(), m.start()) for m in _CAP_TOKEN.finditer(text)]
    if not tokens:
        return set()
    capitalised = [t for t, _ in tokens if t[0].isupper()]
    if len(tokens) >= 3 and len(capitalised) / len(tokens) > 0.6:
        return set()  # Title Case Or SHOUTING: capitals mark nothing
    found = set()
    for token, start in tokens:
        lowered = token.lower()
        if lowered in _NOT_ENTITIES or lowered in MONTHS or lowered in WEEKDAYS:
            continue
        acronym = len(token) >= 2 and token.isupper()
        at_start = start == 0 or bool(_SENTENCE_END.search(text[:start])) or not text[:start].strip()
        if acronym or (token[0].isupper() and not at_start):
            found.add(lowered)
    return found


def entities_conflict(query: str, cached: str) -> bool:
    """Both name entities and the names differ ("Visa" vs "Amex"). One side naming
    none is not a conflict: lower-case chat rarely capitalises names at all."""
    a, b = entity_mentions(query), entity_mentions(cached)
    return bool(a) and bool(b) and a != b


GUARDS: dict[str, Callable[[str, str], bool]] = {
    "negation": negation_conflict,
    "dates": dates_conflict,
    "numbers": numbers_conflict,
    "entities": entities_conflict,
}


def first_conflict(query: str, cached: str, enabled: Iterable[str]) -> str | None:
    """The first enabled guard (in ``GUARD_ORDER``) that vetoes answering ``query``
    with the entry cached for ``cached``; None if all pass. Identical texts
    (up to case and spacing) always pass."""
    enabled = set(enabled)
    if not enabled or " ".join(query.split()).casefold() == " ".join(cached.split()).casefold():
        return None
    for name in GUARD_ORDER:
        if name in enabled and GUARDS[name](query, cached):
            return name
    return None
