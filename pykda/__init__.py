"""pykda: fast attention kernels for hybrid linear-attention LLMs (Kimi Delta Attention
prefill and decode, flash decoding), JIT-compiled from Jinja CUDA templates with NVRTC."""
from .ops.decode import batch_decode_with_padded_kv_cache, single_decode_with_kv_cache
from .ops.paged_decode import BatchDecodeWithPagedKVCache
from .ops.kda import chunk_kda
from .ops.kda_decode import fused_recurrent_kda

__version__ = "0.1.0"
__all__ = ["single_decode_with_kv_cache", "batch_decode_with_padded_kv_cache", "BatchDecodeWithPagedKVCache",
           "chunk_kda", "fused_recurrent_kda", "__version__"]


def __getattr__(name):
    """`pykda.torch_ops` (the ops as torch custom ops, for torch.compile) is imported on first
    use: `import pykda` never imports torch."""
    if name == "torch_ops":
        import importlib
        return importlib.import_module(".torch_ops", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
