"""kvcore's conformance suite: ``KV_BACKEND=<name>[,<name>...]|all pytest --pyargs kv_conformance.tests``."""
