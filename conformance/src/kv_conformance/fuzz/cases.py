"""Fuzz cases: one call of a public member with adversarial arguments, as one line of Python
over the fixture's names (``worker.build``) and ``values``' helpers, and the hypothesis
strategies that draw them. Every member ``kv_api.contract`` declares is drawn: the manager's,
the cache's and the event manager's (constructors, methods, property reads and writes) and the
``Backend`` module functions; those of a capability (``NEEDS``) only for backends that declare
it."""

from __future__ import annotations

import abc
import inspect
import re
from collections.abc import Collection
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import kv_api

#: The fixture's objects per contract: the first is drawn most often.
TARGETS: dict[str, list[str]] = {
    "KVCacheManager": ["m", "m", "m", "ms"],
    "KVCache": ["c0", "c0", "c1", "c2"],
    "KVCacheEventManager": ["em"],
    "Backend": ["b"],
}
OWNERS = {t: owner for owner, targets in TARGETS.items() for t in targets}
#: Members whose results legitimately differ between backends (addresses, build details):
#: only whether they raise, and what, is compared.
OPAQUE = {"KVCacheManager.get_mem_pool_base_address", "Backend.build_info"}


@dataclass(frozen=True)
class Case:
    """``source`` is run on each backend's fixture (``eval``; ``exec`` for an assignment).
    ``exact``: the arguments fit the declared signature, so where the contract fixes the
    message of an error, the messages must match."""

    owner: str
    member: str
    source: str
    exact: bool = True

    @property
    def call(self) -> str:
        return f"{self.owner}.{self.member}"

    @property
    def op(self) -> str:
        return "exec" if re.match(r"^[\w.]+ = ", self.source) else "eval"

    @classmethod
    def parse(cls, source: str) -> Case:
        """The case of a reproducer: ``c0.resize(-1)``, ``c0.capacity = 2``, ``b.KVCacheManager(None)``."""
        match = re.match(r"^(\w+)\.(\w+)", source)
        if not match or match[1] not in OWNERS:
            raise ValueError(f"a case starts with one of {', '.join(sorted(OWNERS))} and a member: {source!r}")
        target, member = match[1], match[2]
        if target == "b" and member in ("KVCacheManager", "KVCacheEventManager"):
            return cls(member, "__init__", source)
        return cls(OWNERS[target], member, source)


# -- argument strategies --------------------------------------------------------------------------

INTS = [
    "0", "1", "-1", "2**31 - 1", "2**31", "2**32", "2**40", "2**62", "2**63 - 1", "2**63", "2**64 - 1", "2**64",
    "2**70", "-(2**31)", "-(2**63)", "-(2**63) - 1", "-(2**64)", "-(2**70)", "10**30",
]  # fmt: skip
ODD_NUMBERS = [
    "True", "False", "np.bool_(True)", "1.5", "0.0", "-0.0", "nan", "inf", "-inf", "1e308", "np.float32(nan)",
    "np.float64(2.0)", "Decimal('NaN')", "Decimal('sNaN')", "Decimal('-Infinity')", "Decimal('1')",
    "Fraction(1, 2)", "1j", "np.int32(5)", "np.int64(-1)", "np.uint64(2**64 - 1)", "np.int8(-1)",
    "np.uint32(2**31)", "np.int64(1)", "IntSub(1)",
]  # fmt: skip
TEXT = [
    "''", "'0'", "'key'", "'value'", "'auto'", "'\\ud800'", "'x' * 100", "StrSub('key')", "'sha256-u32'", "b''",
    "bytes(32)", "b'x' * 31", "bytearray(32)", "memoryview(bytes(32))", "bytes(33)", "bytes(range(32))",
]  # fmt: skip
HOSTILE = [
    "None", "object()", "[]", "()", "{}", "set()", "[1, 2]", "{'a': 1}", "RaisesIndex()", "IndexReturns(2**70)",
    "IndexReturns(-1)", "IndexReturns(1.5)", "IndexReturns(True)", "RaisesLen()", "LiesLen(2**62)", "LiesLen(-1)",
    "LiesLen(1000)", "RaisesIter()", "StopsMidway()", "RaisesBool()", "RaisesHash()", "RaisesEq()",
    "PageIndexMode.SHARED", "CacheTier.HOST_MEM", "KVCacheStatus.ACTIVE", "PageStatus.HELD", "PageIndexMode",
    "m", "c0", "c2", "em", "b", "CONFIG", "other_em", "print", "type", "lambda: 0", "lambda o, lc: 'x'",
    "forged_scope(2**70, None)", "forged_scope(-1, 0)", "forged_scope('a', None)", "forged_scope(True, None)",
    "forged_scope(None, 1.5)", "ReuseScope(2**64 - 1, 0)", "MmItemContext(bytes(32))",
]  # fmt: skip
DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", ">i4", ">u8", "f2", "f4", "f8", "c8", "?", "O", "M8[s]"]
SHAPES = ["(4,)", "(0,)", "(2, 2)", "()", "(1, 8)", "(16,)"]

ARRAYS = st.builds(
    lambda dtype, shape, fill, step, readonly: (
        f"arr({dtype!r}, {shape}"
        + (f", fill={fill}" if fill != "0" else "")
        + (f", step={step}" if step != 1 else "")
        + (", readonly=True" if readonly else "")
        + ")"
    ),
    st.sampled_from(DTYPES),
    st.sampled_from(SHAPES),
    st.sampled_from(["0", "-1", "'arange'", "2**31"]),
    st.sampled_from([1, 2, -1]),
    st.booleans(),
)
ANY_INT = st.one_of(st.sampled_from(INTS), st.integers().map(str))
ADVERSARIAL = st.one_of(
    st.sampled_from(INTS), st.integers().map(str), st.sampled_from(ODD_NUMBERS), st.sampled_from(TEXT),
    st.sampled_from(HOSTILE), ARRAYS,
)  # fmt: skip

TOKEN = st.one_of(
    st.sampled_from([
        "1", "7", "100", "101", "2**31 - 1", "2**32 - 1", "2**32", "2**63", "-1", "True", "1.5", "None",
        "bytes(32)", "bytes(range(32))", "b'x' * 31", "bytearray(32)", "np.int64(5)", "np.int32(-1)",
        "np.uint64(2**64 - 1)", "RaisesIndex()", "IndexReturns(2**70)", "IndexReturns(3)", "IntSub(3)",
        "MmItemContext(bytes(32))", "'1'", "IndexCalls(lambda: m.get_storage_statistics(), 3)",
        "IndexCalls(lambda: m.probe_reuse(None, P0), 4)",
    ]),
    st.integers(0, 2**33).map(str),
)  # fmt: skip
TOKEN_LISTS = st.lists(TOKEN, max_size=10)
TOKENS = st.one_of(
    st.sampled_from([
        "P0", "P0[:6]", "P0[:13]", "P1", "[*P0, 1, 2]", "[]", "hostile('grow-little')", "hostile('clear')",
        "hostile('rewrite')", "hostile('grow')", "None", "RaisesLen()", "LiesLen(2**62)", "LiesLen(-1)",
        "RaisesIter()", "StopsMidway()", "gen(P0)", "'123'", "b'\\x00\\x01\\x02\\x03'", "5", "array('i', P0)",
        "array('d', [1.0])", "memoryview(array('i', P0))", "arr('i4', (12,), fill='arange')",
    ]),
    TOKEN_LISTS.map(lambda items: f"[{', '.join(items)}]"),
    TOKEN_LISTS.map(lambda items: f"({''.join(t + ', ' for t in items)})"),
    TOKEN_LISTS.map(lambda items: f"gen([{', '.join(items)}])"),
    # A reused prefix, then one odd token: the error comes after some of the match.
    st.tuples(st.integers(0, 12), TOKEN).map(lambda p: f"[*P0[:{p[0]}], {p[1]}]"),
    ARRAYS,
)  # fmt: skip

#: Values that reach past each parameter's own checks to the next one, by parameter name.
PLAUSIBLE: dict[str, list[str]] = {
    "layer_id": ["0", "1"],
    "role": ["'key'", "'value'"],
    "index_mode": ["PageIndexMode.PER_LAYER", "PageIndexMode.SHARED", "0", "1"],
    "level": ["0"],
    "pool_group": ["0"],
    "pool": ["0"],
    "reuse_scope": ["None", "ReuseScope(1, None)", "ReuseScope(None, 0)", "c0.reuse_scope"],
    "id": ["None", "7", "0"],
    "custom_priority_callback": ["None", "lambda o, lc: 50", "lambda o, lc: m.probe_reuse(None, P0) % 101"],
    "capacity": ["16", "20", "None", "24", "14"],
    "history_length": ["None", "14", "15", "16"],
    "is_end": ["False", "True"],
    "layer_group": ["0", "1"],
    "beam": ["0"],
    "valid_only": ["False", "True"],
    "buf": ["arr('i4', (8,))", "array('i', [0] * 8)", "None", "bytearray(32)"],
    "stream": ["None"],
    "target_level": ["0", "1"],
    "quota": ["2 << 20", "4 << 20", "1"],
    "best_efforts": ["False", "True"],
    "page_copier": ["None", "kv_api.HostMemoryCopier()"],
    "timeout_ms": ["0", "1", "0.5", "None"],
    "tokens_per_block": ["4", "1"],
    "key_format": ["'sha256-u32'", "'sha256-u64'"],
    "id_offset": ["10", "0"],
    "digest": ["bytes(32)", "bytes(range(32))"],
    "num_tokens": ["2", "1"],
    "token_offset": ["0", "1"],
    "uuid": ["None", "'u'"],
    "cache_salt": ["'tenant'", "''"],
    "key": ["bytes(32)", "bytes(range(32))"],
    "parent_hash": ["0", "2**64 - 1"],
    "config": ["CONFIG"],
    "event_manager": ["None", "b.KVCacheEventManager()"],
    "max_kv_event_entries": ["8", "0", "-1"],
    "hash_algo": ["'v2_sha256'", "'auto'", "'v1_block_key'", "'v2_sha256_64'"],
}
#: Parameters that size a result the caller asked for: a huge valid value is a huge answer,
#: not a bug, so their ints stay small or invalid.
SIZES = {"num_tokens": st.sampled_from(["0", "-1", "2**64", "-(2**70)", "2**16"]) | st.integers(-5, 1000).map(str)}
TOKEN_PARAMETERS = {"tokens", "input_tokens"}


def argument(name: str) -> st.SearchStrategy[str]:
    """Mostly values that pass this parameter's checks, else anything."""
    plausible = TOKENS if name in TOKEN_PARAMETERS else st.sampled_from(PLAUSIBLE.get(name, ["0"]))
    hostile = SIZES[name] | st.sampled_from(ODD_NUMBERS + TEXT + HOSTILE) if name in SIZES else ADVERSARIAL
    return st.one_of(plausible, plausible, hostile)


# -- members ----------------------------------------------------------------------------------

CONTRACTS: list[type[abc.ABC]] = [kv_api.KVCacheManager, kv_api.KVCache, kv_api.KVCacheEventManager]
#: Members a backend implements only with these capabilities (``kv_api.Capabilities``); the
#: others are the core contract (the scratch and SSM members too: without scratch reuse or SSM
#: layers in the fixture's config, they answer as the contract says every backend does).
NEEDS: dict[str, tuple[str, ...]] = {
    f"KVCacheManager.{name}": ("batched_calls",)
    for name in ("resize_many", "commit_many", "admit_many", "decode_steps")
}
#: What the fixture (``worker.fixture_config``) uses when the backends declare it.
FIXTURE_NEEDS = ("host_tier",)
#: Every capability the fuzzer uses: backends alike in these are fuzzed alike.
USED = frozenset([*FIXTURE_NEEDS, *(cap for needs in NEEDS.values() for cap in needs)])


@dataclass(frozen=True)
class Member:
    owner: str
    name: str
    parameters: tuple[inspect.Parameter, ...] | None  # None: a property
    settable: bool = False


def members(capabilities: Collection[str] | None = None) -> list[Member]:
    """Every member the contract declares, read off ``kv_api.contract`` (nothing listed twice),
    but those ``capabilities`` (default: all) leave out."""
    have = None if capabilities is None else set(capabilities)
    return [m for m in _members() if have is None or set(NEEDS.get(f"{m.owner}.{m.name}", ())) <= have]


def _members() -> list[Member]:
    out = []
    for contract in CONTRACTS:
        for name in sorted(contract.__abstractmethods__):
            member = inspect.getattr_static(contract, name)
            if isinstance(member, property):
                out.append(Member(contract.__name__, name, None, member.fset is not None))
            else:
                out.append(Member(contract.__name__, name, tuple(inspect.signature(member).parameters.values())[1:]))
    for name in kv_api.contract.BACKEND_ATTRIBUTES:
        function = getattr(kv_api.Backend, name, None)  # the data attributes are annotations only
        if callable(function):
            out.append(Member("Backend", name, tuple(inspect.signature(function).parameters.values())[1:]))
    return out


def target(member: Member) -> st.SearchStrategy[str]:
    if member.name == "__init__":
        return st.just(f"b.{member.owner}")
    return st.sampled_from(TARGETS[member.owner])


@st.composite
def call_of(draw: st.DrawFn, member: Member) -> Case:
    obj = draw(target(member))
    if member.parameters is None:
        if draw(st.integers(0, 3)) or (not member.settable and draw(st.integers(0, 3))):
            return Case(member.owner, member.name, f"{obj}.{member.name}")
        value = draw(argument(member.name))
        return Case(member.owner, member.name, f"{obj}.{member.name} = {value}", exact=member.settable)
    params = member.parameters
    required = sum(p.default is inspect.Parameter.empty for p in params)
    count = draw(st.integers(required, len(params)))
    args = [draw(argument(p.name)) for p in params[:count]]
    shape = draw(st.sampled_from(["positional"] * 6 + ["keywords", "missing", "extra", "unknown keyword"]))
    exact = shape in ("positional", "keywords")
    if shape == "keywords":
        args = [f"{p.name}={a}" for p, a in zip(params, args, strict=False)]
    elif shape == "missing" and args:
        args.pop()
        exact = len(args) >= required
    elif shape == "extra":
        args += [f"{draw(ADVERSARIAL)}"] * (len(params) + 1 - len(args))
    elif shape == "unknown keyword":
        args.append(f"bogus={draw(ADVERSARIAL)}")
    return Case(member.owner, member.name, f"{obj}({', '.join(args)})" if member.name == "__init__" else
                f"{obj}.{member.name}({', '.join(args)})", exact)  # fmt: skip


def cases(capabilities: Collection[str] | None = None) -> st.SearchStrategy[Case]:
    """Cases of the members backends with ``capabilities`` (default: all) implement."""
    return st.sampled_from(members(capabilities)).flatmap(call_of)


CASES = cases()


def generate(count: int, seed: int, capabilities: Collection[str] | None = None) -> list[Case]:
    """``count`` cases drawn by hypothesis from ``seed`` (the same cases for the same seed and
    capabilities) for backends with ``capabilities`` (default: all)."""
    out: list[Case] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(CASES if capabilities is None else cases(capabilities))
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out[:count]
