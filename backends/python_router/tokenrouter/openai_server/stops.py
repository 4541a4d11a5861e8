"""OpenAI's stop strings on a streamed text: the reply ends before the first one, which is left out.

The fronts stop at a stop word's tokens (and keep them), but a string can also appear across
tokens that tokenize differently in context; matching the text catches both. While streaming,
the end of the text that could be the start of a stop string is held back until the next piece
says whether it is one.
"""

from __future__ import annotations


class StopText:
    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._text = ""  # everything received
        self._sent = 0  # characters of it released
        self.stopped = False

    def feed(self, piece: str, final: bool = False) -> str:
        """The text that may be released after ``piece`` arrived (all of it when ``final``);
        sets ``stopped`` once a stop string is found (nothing is released after it)."""
        if self.stopped:
            return ""
        self._text += piece
        # from the first character not released: a stop that began earlier would have been found then
        found = [at for stop in self._stops if (at := self._text.find(stop, self._sent)) >= 0]
        if found:
            end = min(found)
            self.stopped = True
        else:
            end = len(self._text) if final else max(self._sent, len(self._text) - self._may_begin_a_stop())
        release = self._text[self._sent:end]
        self._sent = end
        return release

    def _may_begin_a_stop(self) -> int:
        """Characters at the end of the text that are the beginning of a stop string. Only the text
        not released yet can be held back, so only that much is tried: trying every prefix of a 100 KB
        stop string took 0.7 s per streamed piece, on the event loop every client shares."""
        unreleased, longest = len(self._text) - self._sent, 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, unreleased), longest, -1):  # the longest first: it is the answer
                if self._text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
