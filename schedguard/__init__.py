"""schedguard: a reference LLM scheduler, a gateway guard, fuzzers and load tests; the
``schedguard`` command is :mod:`schedguard.cli`."""

__version__ = "0.1.0"  # the one definition: pyproject.toml reads it (tool.setuptools.dynamic)
