"""Does an OCR output end in a loop?

Vision-language OCR models sometimes fall into repeating the same words, table row or
line until max_tokens stops them. A loop shows as the *tail* of the text being one unit
(an n-gram of tokens) repeated back to back; text that merely repeats a word here and
there, or a table whose rows differ, does not. Tokens are words, single punctuation
marks and single CJK characters, so Chinese and Japanese loops (no spaces) count too.

`repeated_tail` looks for the shortest unit that the tail repeats; it is a pure function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A CJK/kana/hangul character alone, a run of other word characters, or one other symbol.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]|[^\W\u3040-\u30ff"
                    r"\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+|[^\w\s]")

# Only the end of the text matters; bounding it keeps the check fast on 4,096-token pages.
TAIL_TOKENS = 2048
MIN_REPEATS = 4         # a unit seen 4 times in a row at the very end...
MIN_COVERED_TOKENS = 48  # ...over at least this many tokens (a 1-token unit needs 48 in a row)


@dataclass(frozen=True)
class Repetition:
    unit: str  # the repeated n-gram, tokens joined by spaces
    unit_tokens: int
    repeats: float  # how many times it appears back to back at the end
    covered_tokens: int  # tokens of the tail the loop covers


def tokens_of(text: str) -> list[str]:
    return _TOKEN.findall(text)


def repeated_tail(text: str, min_repeats: int = MIN_REPEATS, min_covered: int = MIN_COVERED_TOKENS,
                  window: int = TAIL_TOKENS) -> Repetition | None:
    """The loop the text ends in, if any: the shortest unit of n tokens such that the last
    `covered` tokens (>= min_covered, >= min_repeats units) repeat it back to back."""
    tokens = tokens_of(text)[-window:]
    count = len(tokens)
    for period in range(1, count // min_repeats + 1):
        # How many tokens from the end agree with the token `period` places earlier.
        matched = 0
        while matched < count - period and tokens[count - 1 - matched] == tokens[count - 1 - matched - period]:
            matched += 1
        covered = matched + period
        if covered >= max(min_covered, min_repeats * period):
            unit = tokens[count - period:]
            return Repetition(" ".join(unit), period, covered / period, covered)
    return None
