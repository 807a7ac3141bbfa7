"""The models wing: a policy from a path or a name, and what we know of each model family.

`policy` loads a model through mlx-lm (adapters, the reference policy, the dtype); `gguf`, `gguf_header` and
`gguf_blocks` read llama.cpp's GGUF files; `smollm2`, `gemma3` and `qwen_coder` are the named sources (a real
model without a model hub, over `wheel_files`); `cpu_kernels` is the CPU's
exponential, attention and gated activation.
"""
