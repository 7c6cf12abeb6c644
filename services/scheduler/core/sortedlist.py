"""A sorted list in chunks: adding or removing one item moves at most a chunk, not half the list.

The capacity index's buckets (node ids by free GPUs) and the running work's estimated ends grow to
tens of thousands of items on a large fleet, and every placement adds to and removes from them: a
plain sorted list moves up to its whole length in memory for each (`insort`, `del`), which made
folding a cycle's decisions cost more the larger the fleet. Items must be orderable and unique
enough that `remove` finds the one meant (equal items are interchangeable).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any, Generic, TypeVar

T = TypeVar("T")

CHUNK = 512  # a chunk splits in two past twice this


class SortedList(Generic[T]):
    __slots__ = ("chunks", "maxes", "size")

    def __init__(self, items: Iterable[T] = ()) -> None:
        ordered: list[Any] = sorted(items)
        self.chunks: list[list[Any]] = [ordered[i : i + CHUNK] for i in range(0, len(ordered), CHUNK)]
        self.maxes: list[Any] = [c[-1] for c in self.chunks]
        self.size = len(ordered)

    def __getstate__(self) -> tuple[list[list[Any]], list[Any], int]:
        return self.chunks, self.maxes, self.size

    def __setstate__(self, state: tuple[list[list[Any]], list[Any], int]) -> None:
        self.chunks, self.maxes, self.size = state

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self.chunks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SortedList) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"SortedList({list(self)!r})"

    def first(self) -> T:
        first: T = self.chunks[0][0]
        return first

    def add(self, item: T) -> None:
        maxes, chunks = self.maxes, self.chunks
        self.size += 1
        if not maxes:
            chunks.append([item])
            maxes.append(item)
            return
        i = bisect_left(maxes, item)
        if i == len(maxes):  # past the last chunk's largest: it goes at the end of the last chunk
            i -= 1
            chunks[i].append(item)
            maxes[i] = item
        else:
            insort(chunks[i], item)
        if len(chunks[i]) > 2 * CHUNK:
            chunk = chunks[i]
            chunks[i : i + 1] = [chunk[:CHUNK], chunk[CHUNK:]]
            maxes[i : i + 1] = [chunk[CHUNK - 1], chunk[-1]]

    def remove(self, item: T) -> None:
        """Remove one item equal to `item` (ValueError if none is)."""
        if not self.discard(item):
            raise ValueError(f"{item!r} is not in the list")

    def discard(self, item: T) -> bool:
        """Remove one item equal to `item`, if there is one (and say whether there was)."""
        maxes, chunks = self.maxes, self.chunks
        i = bisect_left(maxes, item)
        if i == len(maxes):
            return False
        chunk = chunks[i]
        j = bisect_left(chunk, item)
        if chunk[j] != item:
            return False
        del chunk[j]
        self.size -= 1
        if not chunk:
            del chunks[i]
            del maxes[i]
        elif j == len(chunk):
            maxes[i] = chunk[-1]
        return True

    def bisect_right(self, item: Any) -> int:
        """How many items are at most `item` (any value the items compare with)."""
        i = bisect_right(self.maxes, item)
        if i == len(self.maxes):
            return self.size
        return sum(len(c) for c in self.chunks[:i]) + bisect_right(self.chunks[i], item)

    def iter_from(self, start: int) -> Iterator[T]:
        """The items from position `start` on."""
        return islice(iter(self), start, None)
