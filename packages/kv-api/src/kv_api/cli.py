"""The ``kvcore`` command. ``kvcore backends`` lists the installed backends with their build info."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from kv_api.errors import BackendError
from kv_api.registry import available_backends, default_backend_name, installed_backends, load_backend


def backends() -> int:
    """Print every installed backend, its version, build info and capabilities."""
    loadable = available_backends()
    print(f"default backend: {default_backend_name()}")
    status = 0
    for name in installed_backends():
        if name not in loadable:
            try:
                load_backend(name)
            except BackendError as exc:
                print(f"{name}: failed to load\n  {exc}")
                status = 1
            continue
        b = load_backend(name)
        print(f"{name} {b.version}")
        for key, value in b.build_info().items():
            print(f"  {key}: {value}")
        caps = ", ".join(f"{f.name}={getattr(b.capabilities, f.name)}" for f in fields(b.capabilities))
        print(f"  capabilities: {caps}")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcore", description="kvcore: a KV-cache manager for LLM inference")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list installed backends and their build info")
    args = parser.parse_args(argv)
    if args.command == "backends":
        return backends()
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
