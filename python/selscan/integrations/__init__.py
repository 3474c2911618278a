"""Other projects' calling conventions mapped onto libselscan:

    from selscan.integrations.vllm import selective_scan_fn, selective_state_update   # vLLM's Mamba ops
    from selscan.integrations import transformers; transformers.enable()             # transformers' Mamba models

vllm takes an engine's signatures, layouts and index conventions as they are and calls the library's C ABI on the
caller's tensors (docs/serving.md); transformers rebinds the kernel functions transformers' Mamba mixers call
(docs/python.md). Nothing here is imported by `import selscan`.
"""
