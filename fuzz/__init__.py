"""Fuzzing schedguard's targets for resource exhaustion: targets, a resource oracle, engines.

Nothing outside the CLI layer, the benches and the tests imports this package. The pieces:
:mod:`fuzz.targets` (what is fuzzed, with its budgets), :mod:`fuzz.oracle` (runs inputs under
those budgets in a limited worker process), the engines (:mod:`fuzz.engines`), minimisation and
findings (:mod:`fuzz.minimize`, :mod:`fuzz.findings`), campaigns and reports.
"""
