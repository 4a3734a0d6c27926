"""The cost-guided search engine, registered as ``search`` (see :mod:`fuzz.search`)."""

from __future__ import annotations

from fuzz.search import run_search

__all__ = ["NAME", "run_engine"]

NAME = "search"
run_engine = run_search
