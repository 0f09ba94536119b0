"""The trace templates of this package's APIs, one module per operation family.

- ``attention``: single decode/prefill, paged decode (plan and run), paged and ragged
  prefill (run);
- ``gemm``: ``bmm_fp8``, ``mm_fp8``, ``mm_fp4``, ``prepare_low_latency_gemm_weights``;
- ``quantize``: ``fp4_quantize``, ``nvfp4_quantize``;
- ``_init_helpers``: input builders the ``init`` functions share (embedded with them).

``flashinfer.trace.attach`` hands them to the decorated APIs by name.
"""
