"""End-to-end tests against real LLM servers (see conftest.py)."""
