"""What SGLang's `fast_decode_plan` (sglang/srt/layers/attention/flashinfer_backend.py) does to a
FlashInfer decode wrapper in place of `plan()`, on its CUDA-graph replays and draft steps, written
as a sequence of attribute reads and writes for the compat tests (import torch before this module).

SGLang has written the page table into the wrapper's buffers beforehand (with use_cuda_graph), or
hands its own arrays; this step checks the batch size and the indices' room, makes empty tensors
naming the dtypes, reads the indptr back to the host and calls the wrapper's `_cached_module.plan`
with FlashInfer's compiled plan arguments by position: the CUDA-core decode form, or with
`use_tensor_cores` the prefill form (a query row a request, kv lengths made on the host).
FlashInfer's own `flashinfer.decode.fast_decode_plan`, which newer SGLang takes, makes the same
calls, the prefill form with its four later arguments too."""
import torch


def fast_decode_plan(w, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                     page_size: int, kv_dtype=torch.bfloat16, window_left: int = -1, sm_scale=None,
                     flashinfers: bool = False) -> None:
    """`flashinfers`: as FlashInfer's own flashinfer.decode.fast_decode_plan (newer SGLang's), whose
    tensor-core form passes four arguments more."""
    batch = len(last_page_len)
    if w.is_cuda_graph_enabled:
        if batch != w._fixed_batch_size:
            raise ValueError("the batch size is fixed in CUDA-graph mode")
        if len(indices) > len(w._paged_kv_indices_buf):
            raise ValueError("indices exceed the indices buffer")
    else:
        w._paged_kv_indptr_buf, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf = indptr, indices, last_page_len
    empty_q = torch.empty(0, dtype=kv_dtype, device=w.device)
    empty_kv = torch.empty(0, dtype=kv_dtype, device=w.device)
    indptr_host = indptr.cpu()
    workspaces = (w._float_workspace_buffer, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer)
    if w.use_tensor_cores:
        qo_indptr_host = torch.arange(batch + 1, dtype=torch.int32)
        pages = indptr_host[1:] - indptr_host[:-1]
        kv_lens_host = torch.where(pages > 0, (pages - 1) * page_size + last_page_len.cpu(), 0)
        w._plan_info = w._cached_module.plan(*workspaces, qo_indptr_host, indptr_host, kv_lens_host, batch, batch,
                                             num_qo_heads, num_kv_heads, page_size, w.is_cuda_graph_enabled,
                                             head_dim, head_dim, False,
                                             *((window_left, -1, False, 0) if flashinfers else ()))
    else:
        w._plan_info = w._cached_module.plan(*workspaces, indptr_host, batch, num_qo_heads, num_kv_heads, page_size,
                                             w.is_cuda_graph_enabled, window_left, 0.0, head_dim, head_dim, empty_q,
                                             empty_kv)
    w._pos_encoding_mode, w._window_left, w._logits_soft_cap, w._sm_scale = "NONE", window_left, 0.0, sm_scale
