"""OpenAI's stop strings on a streamed text: the reply ends before the first one, which is left out.

The fronts stop at a stop word's tokens (and keep them), but a string can also appear across
tokens that tokenize differently in context; matching the text catches both. While streaming,
the last ``longest stop - 1`` characters are held back: they may be the start of a stop string.
"""

from __future__ import annotations


class StopText:
    def __init__(self, stops: list[str]) -> None:
        self._stops = stops
        self._hold = max((len(stop) for stop in stops), default=1) - 1
        self._text = ""  # everything received
        self._sent = 0  # characters of it released
        self.stopped = False

    def feed(self, piece: str, final: bool = False) -> str:
        """The text that may be released after ``piece`` arrived (all of it when ``final``);
        sets ``stopped`` once a stop string is found (nothing is released after it)."""
        if self.stopped:
            return ""
        self._text += piece
        if not self._stops:
            release = self._text[self._sent:]
            self._sent = len(self._text)
            return release
        # from the first character not released: one that began earlier would have been found then
        found = [at for stop in self._stops if (at := self._text.find(stop, self._sent)) >= 0]
        if found:
            end = min(found)
            self.stopped = True
        else:
            end = len(self._text) if final else max(self._sent, len(self._text) - self._hold)
        release = self._text[self._sent:end]
        self._sent = end
        return release
