"""Block-sparse attention: FlashInfer's BSR-masked wrappers on the paged prefill kernel.

``BlockSparseAttentionWrapper`` is paged prefill with one request per row block (``R``
query rows) whose pages are its nonzero column blocks (``C`` keys each), as FlashInfer
plans it; a per-block ``mask`` becomes the requests' custom mask.
``VariableBlockSparseAttentionWrapper`` (block sizes per kv head) runs each kv head as one
request with its block map expanded to a dense mask.
"""

import torch

from ._attention_common import _common_kwargs, _is_float8, _not_implemented, _WrapperBase
from .api_logging import flashinfer_api
from .prefill import BatchPrefillWithPagedKVCacheWrapper, single_prefill_with_kv_cache


def convert_bsr_mask_layout(mask, indptr):
    """A BSR block mask ``(nnz, R, C)`` as FlashInfer's flattened per-request mask: row
    block i's blocks side by side, ``R`` rows of ``C * blocks`` keys, rows concatenated.

    Parameters
    ----------
    mask : torch.Tensor
        bool ``(nnz, R, C)``.
    indptr : torch.Tensor
        ``(MB + 1,)`` offsets of each row block's blocks.

    Returns
    -------
    torch.Tensor
        bool ``(nnz * R * C,)``.
    """
    bounds = indptr.tolist()
    parts = [mask[a:z].transpose(0, 1).reshape(-1) for a, z in zip(bounds, bounds[1:])]
    return torch.cat(parts) if parts else mask.reshape(-1)


class BlockSparseAttentionWrapper(_WrapperBase):
    """Attention under a block-sparse (BSR) mask of ``R x C`` blocks: ``plan``, then ``run``.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Accepted for compatibility.
    backend : str
        Accepted for compatibility (the vsa backends' ``block_mask`` is refused in plan).
    """

    def __init__(self, float_workspace_buffer, backend="auto"):
        self._float_workspace_buffer = float_workspace_buffer
        self._backend = backend
        self._use_cuda_graph = False
        self._paged = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer)

    @property
    def _plan(self):
        return self._paged._plan

    @property
    def _kv_layout(self):
        return "NHD"

    @flashinfer_api
    def plan(
        self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
        packed_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
        logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
        q_data_type="float16", kv_data_type=None, o_data_type="float16", non_blocking=True,
        block_mask=None,
    ):  # fmt: skip
        """Records the block pattern: ``indptr`` ``(MB + 1,)`` and ``indices`` (column
        blocks, ``< N // C``) of an ``M x N`` matrix of ``R x C`` blocks; ``mask`` (bool
        ``(nnz, R, C)``) or ``packed_mask`` hide keys inside blocks. The other settings are
        those of ``BatchPrefillWithPagedKVCacheWrapper.plan``. ``block_mask`` (FlashInfer's
        vsa GPU backends) is not implemented."""
        if block_mask is not None:
            _not_implemented("block_mask", "a tensor", "None (indptr/indices give the pattern)")
        blocks = len(indptr) - 1
        qo_indptr = R * torch.arange(blocks + 1, dtype=torch.int32)
        qo_indptr[-1] = M
        custom = None if mask is None else convert_bsr_mask_layout(mask, indptr.cpu())
        self._paged.plan(
            qo_indptr,
            indptr,
            indices,
            torch.full((blocks,), C, dtype=torch.int32),
            num_qo_heads,
            num_kv_heads,
            head_dim,
            C,
            custom_mask=custom,
            packed_custom_mask=None if mask is not None else packed_mask,
            causal=causal,
            pos_encoding_mode=pos_encoding_mode,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            o_data_type=o_data_type,
        )
        self._block_cols = C

    @flashinfer_api
    def run(
        self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None,
        return_lse=False, enable_pdl=None,
    ):  # fmt: skip
        """Attention of q ``(M, num_qo_heads, head_dim)`` over k, v ``(N, num_kv_heads,
        head_dim)`` under the planned pattern; ``scale_q/k/v`` are the per-head scales of
        float8 inputs. Returns the output (and lse when asked)."""
        c = self._block_cols
        pages = (k.reshape(-1, c, *k.shape[1:]), v.reshape(-1, c, *v.shape[1:]))
        scales = (scale_q, scale_k, scale_v) if _is_float8(q) else ()
        return self._paged.run(q, pages, *scales, out=out, lse=lse, return_lse=return_lse)

    def forward(
        self, q, k, v, scale_q=None, scale_k=None, scale_v=None, pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None,
        rope_theta=None,
    ):  # fmt: skip
        """Deprecated in FlashInfer: run() with these settings replacing the plan's."""
        plan = self._paged._plan
        if plan is None:
            raise RuntimeError("forward: plan() must be called before forward()")
        plan.settings = _common_kwargs(
            "NHD", pos_encoding_mode, -1, logits_soft_cap, sm_scale, rope_scale, rope_theta
        )
        return self.run(q, k, v, scale_q, scale_k, scale_v)


class VariableBlockSparseAttentionWrapper(_WrapperBase):
    """Block-sparse attention whose block sizes vary per kv head: ``plan``, then ``run``.

    Parameters
    ----------
    float_workspace_buffer : torch.Tensor
        Accepted for compatibility.
    backend : str
        Accepted for compatibility.
    """

    def __init__(self, float_workspace_buffer, backend="auto"):
        self._float_workspace_buffer = float_workspace_buffer
        self._backend = backend
        self._use_cuda_graph = False
        self._masks = None

    @flashinfer_api
    def plan(
        self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim,
        causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None,
        sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, q_data_type="float16",
        kv_data_type=None,
    ):  # fmt: skip
        """Records kv head h's pattern: ``block_mask_map[h]`` (bool ``(MB, NB)``) over row
        blocks of ``block_row_sz[h]`` queries and column blocks of ``block_col_sz[h]``
        keys; the settings are those of :func:`single_prefill_with_kv_cache`."""
        if causal:
            _not_implemented("causal", causal, "False (the block map is the mask)")
        if block_mask_map.shape[0] != num_kv_heads or num_qo_heads % num_kv_heads:
            raise ValueError(
                f"block_mask_map: {block_mask_map.shape[0]} maps for {num_kv_heads} kv heads "
                f"and {num_qo_heads} qo heads; accepted: one per kv head, dividing the qo heads"
            )
        maps = block_mask_map.cpu()
        rows, cols = block_row_sz.cpu().long(), block_col_sz.cpu().long()
        self._masks = [
            maps[h].repeat_interleave(rows[h], dim=0).repeat_interleave(cols[h], dim=1)
            for h in range(num_kv_heads)
        ]
        self._settings = dict(
            pos_encoding_mode=pos_encoding_mode,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        self._group = num_qo_heads // num_kv_heads
        self._o_dtype = q_data_type

    @flashinfer_api
    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None):
        """Attention of q ``(num_qo_heads, qo_len, head_dim)`` over k, v ``(num_kv_heads,
        kv_len, head_dim)`` (heads first); returns ``(num_qo_heads, qo_len, head_dim)``
        (and lse ``(num_qo_heads, qo_len)`` when asked)."""
        if self._masks is None:
            raise RuntimeError("run: plan() must be called before run()")
        g, outs, lses = self._group, [], []
        for h, mask in enumerate(self._masks):
            o, s = single_prefill_with_kv_cache(
                q[h * g : (h + 1) * g].transpose(0, 1),
                k[h : h + 1].transpose(0, 1),
                v[h : h + 1].transpose(0, 1),
                custom_mask=mask,
                return_lse=True,
                **self._settings,
            )
            outs.append(o.transpose(0, 1))
            lses.append(s.transpose(0, 1))
        result = torch.cat(outs)
        if out is not None:
            out.copy_(result)
            result = out
        if not return_lse:
            return result
        lse_all = torch.cat(lses)
        if lse is not None:
            lse.copy_(lse_all)
            lse_all = lse
        return result, lse_all
