def block_keys(
    tokens_per_block: object, reuse_scope: object | None, tokens: object | None, key_format: object = "sha256-u32"
) -> bytes:
    """
    The chained keys of ``tokens``, root first, concatenated (32 bytes each).
    """

class BlockKeyIterator:
    def __iter__(self) -> object: ...
    def __next__(self) -> tuple: ...

def sequence_to_blockchain_keys(
    tokens_per_block: object, reuse_scope: object | None, tokens: object | None, key_format: object = "sha256-u32"
) -> BlockKeyIterator:
    """
    Yield ``([], root_key)`` then ``(block_tokens, block_key)`` per block; validates now, hashes lazily.
    """

def reuse_scope_to_bytes(reuse_scope: object | None) -> bytes: ...
def gen_multimodal_cache_key_tokens(
    id_offset: object, digest: object, num_tokens: object, token_offset: object = 0, uuid: object | None = None
) -> list: ...
def cache_salt_to_id(cache_salt: object) -> int: ...
def block_hash_v2_sha256(key: object) -> str: ...
def block_hash_v2_sha256_64(key: object) -> int: ...
def block_hash_v1(tokens: object, parent_hash: object, reuse_scope: object | None = None) -> int: ...
def sha256(data: bytes) -> bytes:
    """
    SHA-256 of ``data`` through the active transform (for known-answer tests).
    """

class KVCacheManager:
    def __init__(self, config: object | None, event_manager: object | None = None) -> None: ...
    @property
    def init_config(self) -> object: ...
    @property
    def tokens_per_block(self) -> int: ...

def build_info() -> list[tuple[str, str]]:
    """Compiler, flags, build type and the SHA-256 transform in use."""

def sha256_transforms() -> list[str]:
    """SHA-256 transforms this build and CPU can run."""

def sha256_transform() -> str:
    """The SHA-256 transform in use."""

def select_sha256_transform(name: str) -> None:
    """
    Force a SHA-256 transform (tests and benchmarks); ValueError if this machine cannot run it.
    """
