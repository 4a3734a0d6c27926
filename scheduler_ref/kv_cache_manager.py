"""Per-request KV block tables on top of :class:`~scheduler_ref.block_pool.BlockPool`.

A request's block size is fixed at its first allocation from the longest its sequence can get
(prompt + max_tokens), using the seed's rule, so a sequence never mixes block sizes.

Two ways to get blocks:

- :meth:`KVCacheManager.admit` (waiting -> running) refuses when the pool's free units after
  the allocation would fall below the watermark, keeping headroom for running requests to grow;
- :meth:`KVCacheManager.allocate_slots` (a running request growing) may use the headroom.

Counters: ``allocation_attempts``/``allocation_failures`` (the pool lacked the units) and
``admission_refusals`` (units existed but the watermark held). Fragmentation is the fraction of
allocated token slots not holding a token of any request (the unused tail of last blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_ref.block_pool import BASE_BLOCK_TOKENS, Block, BlockPool
from scheduler_ref.config import SchedulerConfig
from scheduler_ref.request import Request


@dataclass(frozen=True)
class KVCacheStats:
    total_units: int
    free_units: int
    allocated_units: int
    usage: float
    fragmentation: float
    allocation_attempts: int
    allocation_failures: int
    admission_refusals: int


class KVCacheManager:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_kv_blocks)
        self.watermark_units = config.watermark_units
        self._blocks: dict[str, list[Block]] = {}
        self._block_size: dict[str, int] = {}
        # Tokens each request's allocation covers (computed + scheduled this step).
        self._covered: dict[str, int] = {}
        self._covered_total = 0
        self.allocation_attempts = 0
        self.allocation_failures = 0
        self.admission_refusals = 0

    # -- sizing ------------------------------------------------------------------------------

    def block_size(self, request: Request) -> int:
        bs = self._block_size.get(request.request_id)
        return self.config.block_size(request.max_seq_len) if bs is None else bs

    def units_needed(self, request: Request, num_new_tokens: int) -> int:
        """Units to allocate so ``request`` can hold ``num_new_tokens`` more tokens."""
        bs = self.block_size(request)
        have = len(self._blocks.get(request.request_id, ()))
        want = -(-(request.num_computed_tokens + num_new_tokens) // bs)
        return max(0, want - have) * (bs // BASE_BLOCK_TOKENS)

    def units_held(self, request_id: str) -> int:
        return sum(len(b.units) for b in self._blocks.get(request_id, ()))

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(b.block_id for b in self._blocks.get(request_id, ()))

    def can_admit(self, units: int) -> bool:
        return self.pool.num_free_units - units >= self.watermark_units

    # -- allocation --------------------------------------------------------------------------

    def admit(self, request: Request, num_new_tokens: int) -> bool:
        """Allocate for a request leaving the waiting queue, honouring the watermark."""
        units = self.units_needed(request, num_new_tokens)
        if units > self.pool.num_free_units:
            self.allocation_attempts += 1
            self.allocation_failures += 1
            return False
        if not self.can_admit(units):
            self.admission_refusals += 1
            return False
        return self.allocate_slots(request, num_new_tokens)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow ``request``'s blocks to cover ``num_new_tokens`` more tokens (no watermark)."""
        rid = request.request_id
        bs = self.block_size(request)
        blocks = self._blocks.get(rid)
        have = 0 if blocks is None else len(blocks)
        covered = request.num_computed_tokens + num_new_tokens
        want = -(-covered // bs)
        if want > have:
            self.allocation_attempts += 1
            new = self.pool.allocate(want - have, bs)
            if new is None:
                self.allocation_failures += 1
                return False
            if blocks is None:
                blocks = self._blocks[rid] = []
                self._block_size[rid] = bs
            blocks.extend(new)
        self._covered_total += covered - self._covered.get(rid, 0)
        self._covered[rid] = covered
        return True

    def free(self, request_id: str) -> int:
        """Return every block of ``request_id`` to the pool; the number of units freed."""
        blocks = self._blocks.pop(request_id, None)
        self._block_size.pop(request_id, None)
        self._covered_total -= self._covered.pop(request_id, 0)
        if not blocks:
            return 0
        self.pool.free(blocks)
        return sum(len(b.units) for b in blocks)

    # -- metrics -----------------------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self.pool.num_allocated_units / self.pool.num_units

    @property
    def fragmentation(self) -> float:
        slots = self.pool.num_allocated_units * BASE_BLOCK_TOKENS
        return 0.0 if slots == 0 else 1.0 - self._covered_total / slots

    def stats(self) -> KVCacheStats:
        pool = self.pool
        return KVCacheStats(
            total_units=pool.num_units,
            free_units=pool.num_free_units,
            allocated_units=pool.num_allocated_units,
            usage=self.usage,
            fragmentation=self.fragmentation,
            allocation_attempts=self.allocation_attempts,
            allocation_failures=self.allocation_failures,
            admission_refusals=self.admission_refusals,
        )
