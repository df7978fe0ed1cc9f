"""Known divergences: findings the fuzzer expects until their fix lands, each naming the call,
the kind of finding, the arguments that show it (a regular expression over the case's source)
and why. Each entry's ``example`` runs in every fuzz run, so an entry whose example no longer
diverges is reported as stale: remove it, the list only shrinks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kv_conformance.fuzz.cases import Case


@dataclass(frozen=True)
class Known:
    calls: tuple[str, ...]  # "<contract>.<member>", as Case.call
    kinds: tuple[str, ...]  # runner.KINDS entries
    pattern: str  # searched in the case's source
    example: str  # a case showing it, run every time
    reason: str
    #: The backends it shows on: both for a comparison, the faulty one for a crash or hang.
    needs: tuple[str, ...] = ("py", "cpp")

    def matches(self, kind: str, case: Case) -> bool:
        return kind in self.kinds and case.call in self.calls and re.search(self.pattern, case.source) is not None

    def applies(self, backends: list[str]) -> bool:
        return all(name in backends for name in self.needs)


_LAYOUT = (
    "KVCacheManager.get_page_stride",
    "KVCacheManager.get_page_index_converter",
    "KVCacheManager.get_page_index_upper_bound",
    "KVCacheManager.get_mem_pool_base_address",
)
_SCOPED = (
    "Backend.reuse_scope_to_bytes",
    "Backend.block_keys",
    "Backend.sequence_to_blockchain_keys",
    "Backend.block_hash_v1",
    "KVCacheManager.create_kv_cache",
    "KVCacheManager.probe_reuse",
    "KVCacheManager.probe_first_new_block_key",
)
_DIFFER = ("class", "message")

KNOWN: list[Known] = [
    Known(
        (
            *_LAYOUT,
            "KVCacheManager.pool_memory",
            "KVCacheManager.get_layer_group_id",
            "KVCache.capacity",
            "KVCache.history_length",
            "KVCache.get_base_page_indices",
            "KVCache.get_aggregated_page_indices",
            "KVCache.set_base_page_index_buf",
            "Backend.gen_multimodal_cache_key_tokens",
            "Backend.block_hash_v1",
        ),
        _DIFFER,
        r"\bNone\b",
        "c0.capacity = None",
        "None where an int or str is declared: nanobind refuses it for a plain `object` parameter with its own "
        "'incompatible function arguments' TypeError, before the state and earlier arguments are checked (and "
        "kv_core_py's setters pass None on to resize, which takes it as 'unchanged')",
    ),
    Known(
        _LAYOUT,
        _DIFFER,
        r"^m\.\w+\((layer_id=)?(?![01][,)])",
        "m.get_page_stride(2**70, 1)",
        'an unknown layer: kv_core_py checks the role\'s type first and says "no buffer R in layer L", the '
        'binding checks the layer first and says "no layer L"',
    ),
    Known(
        ("KVCacheManager.get_layer_group_id",),
        _DIFFER,
        r"np\.|IndexReturns|arr\(",
        "m.get_layer_group_id(np.int64(-1))",
        "kv_core_py looks the layer id up as given (no __index__; its repr in the KeyError), the binding "
        "converts it with __index__ first",
    ),
    Known(
        ("Backend.block_hash_v1",),
        (*_DIFFER, "value"),
        r"^b\.block_hash_v1\((tokens=)?(?!\[|P[01]\b)",
        "b.block_hash_v1(b'x' * 31, 2)",
        "tokens that are no list: kv_core_py iterates any iterable (str, bytes, narrow buffers, a list that "
        "its tokens mutate, read as it changes) and lets Python's 'not iterable' through; the binding reads "
        "them as the key functions do",
    ),
    Known(
        _SCOPED,
        _DIFFER,
        r"forged_scope",
        "b.reuse_scope_to_bytes(forged_scope(-1, 0))",
        "a ReuseScope whose fields skipped validation: kv_core_py raises struct.error, the binding "
        "RuntimeError('std::bad_cast'); neither re-checks the fields",
    ),
    Known(
        (
            *_LAYOUT,
            "KVCacheEventManager.__init__",
            "Backend.cache_salt_to_id",
            "Backend.block_keys",
            "Backend.sequence_to_blockchain_keys",
            "Backend.gen_multimodal_cache_key_tokens",
        ),
        _DIFFER,
        r"\\ud800",
        "m.get_page_stride(0, '\\ud800')",
        "a str that is no UTF-8 (a lone surrogate): the binding's conversion to std::string raises "
        "UnicodeEncodeError before the value is looked up",
    ),
    Known(
        ("KVCache.commit",),
        ("class",),
        r"commit\((tokens=)?None\b",
        "c0.commit(None)",
        "the binding takes None tokens as none; kv_core_py refuses them (TypeError), as the contract types them",
    ),
    Known(
        ("Backend.gen_multimodal_cache_key_tokens",),
        ("hang",),
        r"2\*\*6[4-9]|2\*\*70|10\*\*30",
        "b.gen_multimodal_cache_key_tokens(3, bytes(32), 2**64)",
        "num_tokens of 2**64 or more: the binding does not refuse it and loops (kv_core_py refuses it)",
        needs=("cpp",),
    ),
    Known(
        ("Backend.gen_multimodal_cache_key_tokens",),
        ("class",),
        r".",
        "b.gen_multimodal_cache_key_tokens(0, bytes(32), 2, 1, 5)",
        "a bad uuid when token_offset leaves the digest out: kv_core_py never looks at it, the binding refuses it",
    ),
]


def pinned(known: list[Known], backends: list[str]) -> list[Case]:
    """The examples of the entries that can show on ``backends``, as cases."""
    return [Case.parse(k.example) for k in known if k.applies(backends)]
