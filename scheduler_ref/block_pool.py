"""A paged KV block pool with the seed's dynamic block size.

Mixed block sizes: the pool is a set of *units* of ``BASE_BLOCK_TOKENS`` (16) token slots. A
block of 16, 32 or 64 tokens takes 1, 2 or 4 units. Units are contiguous by accounting only:
the simulated executor has no memory layout, so any free units form a block and the pool has no
external fragmentation; what the dynamic size changes is the number of block-table entries of
long sequences (a 128k-token sequence has 2048 entries instead of 8192) and the internal
fragmentation of each request's last block, which :mod:`scheduler_ref.kv_cache_manager`
measures. Units are conserved: ``allocated + free == total`` at all times.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

BASE_BLOCK_TOKENS = 16
_LONG = 64 * 1024
_MEDIUM = 16 * 1024


def block_size_for(seq_len: int) -> int:
    """The seed's rule: sequences longer than 64k tokens use 64-token blocks, longer than 16k
    use 32, others 16."""
    if seq_len > _LONG:
        return 64
    if seq_len > _MEDIUM:
        return 32
    return BASE_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class Block:
    """One allocated block: its id (its first unit), its size in tokens and its units."""

    block_id: int
    size: int
    units: tuple[int, ...]


class BlockPool:
    """Free-list allocator over ``num_units`` units; allocation is all-or-nothing."""

    def __init__(self, num_units: int) -> None:
        if num_units < 1:
            raise ValueError("a block pool needs at least one unit")
        self.num_units = num_units
        # FIFO free list, as vLLM's: recently freed units are reused last.
        self._free: deque[int] = deque(range(num_units))
        self._allocated = 0

    @property
    def num_free_units(self) -> int:
        return len(self._free)

    @property
    def num_allocated_units(self) -> int:
        return self._allocated

    def allocate(self, count: int, block_size: int) -> list[Block] | None:
        """``count`` blocks of ``block_size`` tokens, or None (nothing taken) if short."""
        per = _units_per_block(block_size)
        need = count * per
        if need > len(self._free):
            return None
        blocks = []
        pop = self._free.popleft
        for _ in range(count):
            units = tuple(pop() for _ in range(per))
            blocks.append(Block(units[0], block_size, units))
        self._allocated += need
        return blocks

    def free(self, blocks: list[Block]) -> None:
        for block in blocks:
            self._free.extend(block.units)
            self._allocated -= len(block.units)
        if self._allocated < 0:  # pragma: no cover - a double free is a bug in the caller
            raise AssertionError("block pool: more units freed than allocated")


def _units_per_block(block_size: int) -> int:
    if block_size < BASE_BLOCK_TOKENS or block_size % BASE_BLOCK_TOKENS:
        raise ValueError(f"block size must be a multiple of {BASE_BLOCK_TOKENS}: {block_size}")
    return block_size // BASE_BLOCK_TOKENS
