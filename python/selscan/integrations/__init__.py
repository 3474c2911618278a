"""Serving engines' own calling conventions mapped onto libselscan (docs/serving.md):

    from selscan.integrations.vllm import selective_scan_fn, selective_state_update   # vLLM's Mamba ops

Each module takes an engine's signatures, layouts and index conventions as they are and calls the library's C ABI
on the caller's tensors; nothing here is imported by `import selscan`.
"""
