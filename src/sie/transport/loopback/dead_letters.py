"""The loopback's dead letters (`--role all`, tests): the DeadLetterStore protocol in bounded memory, standing in
for the `DEAD_LETTERS` stream (Limits retention: the oldest letters go first past MAX_LETTERS, and each is kept
for MAX_AGE_S, as the stream's 24 h max_age).

Owns the letters and their ids; the message a letter is made of is taken from its pool stream (take_dead).
"""

from __future__ import annotations

import datetime
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from sie.transport.base import DeadLetter, MaxDeliveriesAdvisory
from sie.transport.loopback.stream import PoolStream

MAX_LETTERS: Final = 10_000
MAX_AGE_S: Final = 24 * 3600.0

# The pool stream of a stream name (`WORK_POOL_{pool}`), None when there is none.
StreamLookup = Callable[[str], PoolStream | None]


class LoopbackDeadLetterStore:
    """Dead letters by id (1, 2, …), oldest first; nothing here touches a broker."""

    def __init__(
        self,
        streams: StreamLookup,
        max_letters: int = MAX_LETTERS,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._streams = streams
        self._max_letters = max_letters
        self._max_age_s = max_age_s
        self._clock = clock
        self._letters: OrderedDict[int, tuple[float, DeadLetter]] = OrderedDict()  # id -> (stored at, letter)
        self._next_id = 1

    def __len__(self) -> int:
        self._expire()
        return len(self._letters)

    async def stranded(self, limit: int, min_age_s: float) -> list[MaxDeliveriesAdvisory]:
        """None: the in-process streams hand their advisories to the gateway of the same process, never lost."""
        return []

    async def capture(self, advisory: MaxDeliveriesAdvisory) -> DeadLetter | None:
        """Take the dead message the advisory names from its pool stream; None when it is not (or no longer) there."""
        stream = self._streams(advisory.stream)
        if stream is None:
            return None
        message = stream.take_dead(advisory.stream_seq)
        if message is None:
            return None
        now = self._clock()
        letter = DeadLetter(
            letter_id=self._next_id,
            subject=message.subject,
            stream=advisory.stream,
            stream_seq=advisory.stream_seq,
            consumer=advisory.consumer,
            deliveries=advisory.deliveries,
            dead_at=advisory.timestamp or _rfc3339(now),
            published_at=_rfc3339(now - (stream.loop.time() - message.published_at)),
            item=message.item,
        )
        self._next_id += 1
        self._letters[letter.letter_id] = (now, letter)
        while len(self._letters) > self._max_letters:
            self._letters.popitem(last=False)
        return letter

    async def letters(self, after: int, limit: int) -> list[DeadLetter]:
        """Up to `limit` letters with ids above `after`, oldest first."""
        self._expire()
        found: list[DeadLetter] = []
        for letter_id, (_, letter) in self._letters.items():
            if len(found) >= limit:
                break
            if letter_id > after:
                found.append(letter)
        return found

    async def get(self, letter_id: int) -> DeadLetter | None:
        """One letter; None when there is none with that id."""
        self._expire()
        entry = self._letters.get(letter_id)
        return entry[1] if entry is not None else None

    async def delete(self, letter_id: int) -> bool:
        """Remove one letter; False when there was none."""
        self._expire()
        return self._letters.pop(letter_id, None) is not None

    async def purge(self) -> int:
        """Remove every letter; returns how many there were."""
        self._expire()
        count = len(self._letters)
        self._letters.clear()
        return count

    def _expire(self) -> None:
        cutoff = self._clock() - self._max_age_s
        while self._letters:
            stored_at, _ = next(iter(self._letters.values()))
            if stored_at > cutoff:
                return
            self._letters.popitem(last=False)


def _rfc3339(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.UTC).isoformat()
