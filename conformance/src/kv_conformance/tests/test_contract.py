"""Every backend implements every member ``kv_api.contract`` declares, as declared: a method where
the contract has a method, a property (settable exactly where the contract's is) where it has a
property, with the same parameter names, order and defaults wherever the signature can be read
(``inspect`` for Python classes, ``__nb_signature__`` for nanobind ones). The constants a
backend declares itself equal ``kv_api.constants``."""

from __future__ import annotations

import abc
import ast
import inspect
import re
from typing import Any

import pytest

import kv_api
from kv_api import constants

from ._manager import make_manager

CONTRACT: list[type[abc.ABC]] = [kv_api.KVCacheManager, kv_api.KVCache, kv_api.KVCacheEventManager]
#: The contract's classes with methods only (no property to refuse assignment) too.
CLASSES: list[type[abc.ABC]] = [*CONTRACT, kv_api.PlannedDropHandle]
NO_DEFAULT = inspect.Parameter.empty
#: (name, default or NO_DEFAULT) per parameter, ``self`` included.
Parameters = list[tuple[str, object]]


def backend_class(backend: kv_api.Backend, contract: type[abc.ABC]) -> type:
    if contract is kv_api.KVCache:  # not a module attribute: caches come from their manager
        return type(make_manager(backend).create_kv_cache())
    if contract is kv_api.PlannedDropHandle:  # nor handles: they come from a finished cache
        cache = make_manager(backend).create_kv_cache()
        assert cache.resume() and cache.resize(4)
        cache.commit([1, 2, 3, 4], is_end=True)
        return type(cache.plan_committed_block_drop())
    cls: type = getattr(backend, contract.__name__)
    return cls


def declared(contract: type[abc.ABC]) -> list[str]:
    # Every member of the contract is abstract, so a Python backend cannot silently inherit one.
    return sorted(contract.__abstractmethods__)


def _nanobind_parameters(signatures: tuple[tuple[str, object, tuple[object, ...]], ...]) -> Parameters:
    """Parse nanobind's ``def f(self, a: T = \\0) -> R`` (default ``i`` of the tuple at ``\\i``)."""
    assert len(signatures) == 1, "an overloaded member is not what the contract declares"
    text, _, defaults = signatures[0]
    source = re.sub(r"\\(\d+)", r"__nb_default_\1", text) + ": ..."
    fn = ast.parse(source).body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = [*fn.args.posonlyargs, *fn.args.args]
    values: list[object] = [NO_DEFAULT] * (len(args) - len(fn.args.defaults))
    for node in fn.args.defaults:
        if isinstance(node, ast.Name) and node.id.startswith("__nb_default_"):
            values.append(defaults[int(node.id.removeprefix("__nb_default_"))])
        else:
            values.append(ast.literal_eval(node))
    return [(a.arg, v) for a, v in zip(args, values, strict=True)]


def parameters(member: Any) -> Parameters | None:
    """The member's parameters, or None where nothing describes them."""
    nb_signature = getattr(member, "__nb_signature__", None)
    if nb_signature is not None:
        return _nanobind_parameters(nb_signature)
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize("contract", CLASSES, ids=[c.__name__ for c in CLASSES])
def test_classes_are_the_contracts(backend: kv_api.Backend, contract: type[abc.ABC]) -> None:
    assert issubclass(backend_class(backend, contract), contract)


@pytest.mark.parametrize("contract", CLASSES, ids=[c.__name__ for c in CLASSES])
def test_every_declared_member_is_implemented_as_declared(backend: kv_api.Backend, contract: type[abc.ABC]) -> None:
    cls = backend_class(backend, contract)
    checked = 0
    for name in declared(contract):
        want = inspect.getattr_static(contract, name)
        try:
            got = inspect.getattr_static(cls, name)
        except AttributeError:
            pytest.fail(f"{cls.__qualname__} lacks {name}")
        assert not getattr(got, "__isabstractmethod__", False), f"{cls.__qualname__}.{name} is not implemented"
        if isinstance(want, property):
            assert isinstance(got, property), f"{cls.__qualname__}.{name} must be a property"
            settable = want.fset is not None
            assert (got.fset is not None) == settable, f"{cls.__qualname__}.{name}: settable must be {settable}"
            continue
        assert callable(got) and not inspect.isdatadescriptor(got), f"{cls.__qualname__}.{name} must be a method"
        got_parameters = parameters(got)
        if got_parameters is not None:
            assert got_parameters == parameters(want), f"{cls.__qualname__}.{name}"
            checked += 1
    # A signature nobody can read is tolerated per member, not for the whole class.
    assert checked, f"no signature of {cls.__qualname__} could be read"


def backend_instance(backend: kv_api.Backend, contract: type[abc.ABC]) -> object:
    if contract is kv_api.KVCacheEventManager:
        return backend.KVCacheEventManager()
    manager = make_manager(backend)
    return manager if contract is kv_api.KVCacheManager else manager.create_kv_cache()


@pytest.mark.parametrize("contract", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_read_only_properties_refuse_assignment(backend: kv_api.Backend, contract: type[abc.ABC]) -> None:
    """A property the contract declares without a setter (the cache's ``id``, ``reuse_scope``,
    ``num_reused_tokens``, the event manager's ``hash_algo``, ...) is no writable attribute."""
    obj = backend_instance(backend, contract)
    read_only = [
        name
        for name in declared(contract)
        if isinstance(member := inspect.getattr_static(contract, name), property) and member.fset is None
    ]
    assert read_only
    for name in read_only:
        value = getattr(obj, name)
        with pytest.raises(AttributeError) as caught:
            setattr(obj, name, value)
        assert type(caught.value) is AttributeError, f"{name}: {caught.value!r}"
        assert getattr(obj, name) == value, name


#: The plain values of kv_api.constants (page index, priorities, key-format names, ...), not its enums.
VALUE_CONSTANTS = [n for n in constants.__all__ if type(getattr(constants, n)) in (int, str, tuple)]


def test_declared_constants_match_kv_api(backend: kv_api.Backend) -> None:
    own = {n: getattr(backend, n) for n in VALUE_CONSTANTS if hasattr(backend, n)}
    if not own:
        pytest.skip(f"backend {backend.name!r} declares none of {', '.join(VALUE_CONSTANTS)}")
    assert own == {n: getattr(constants, n) for n in own}
    assert all(type(v) is type(getattr(constants, n)) for n, v in own.items()), own
