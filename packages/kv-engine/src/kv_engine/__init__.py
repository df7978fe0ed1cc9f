"""kvcore's reference engine: Hugging Face transformers models whose keys, values and Mamba
states live in kvcore's pages (docs/engine.md).

```python
engine = kv_engine.Engine(model, backend=None, tokens_per_block=16, device_quota=64 << 20)
out = engine.generate(prompts, max_new_tokens=16, scopes=None)  # prompts: token-id lists
out[i].tokens, out[i].reused_tokens
```
"""

from kv_engine.engine import DEFAULT_DEVICE_QUOTA, Engine, EngineStats
from kv_engine.layout import BufferView, ModelLayout, PageViews, model_layout
from kv_engine.models import MODEL_NAMES, load_model, tiny_model
from kv_engine.paged_cache import PagedCache
from kv_engine.sequence import Output

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_DEVICE_QUOTA",
    "MODEL_NAMES",
    "BufferView",
    "Engine",
    "EngineStats",
    "ModelLayout",
    "Output",
    "PageViews",
    "PagedCache",
    "load_model",
    "model_layout",
    "tiny_model",
]
