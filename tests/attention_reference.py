"""Float32 torch reference for the attention tests: expand kv heads, mask, softmax, matmul."""

import math

import torch


def rope_llama(x, positions, rope_scale=1.0, rope_theta=1e4):
    """Rotate-half RoPE of x [n, heads, d] at the given positions [n]."""
    d = x.shape[-1]
    freq = (1.0 / rope_scale) * (1.0 / rope_theta) ** (
        torch.arange(d // 2, dtype=torch.float32) * 2 / d
    )
    angle = positions.to(torch.float32)[:, None] * freq[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(
    q,
    k,
    v,
    causal=False,
    mask=None,
    window_left=-1,
    soft_cap=None,
    sm_scale=None,
    rope=False,
    rope_scale=1.0,
    rope_theta=1e4,
    v_scale=1.0,
    sinks=None,
    alibi=False,
):
    """q [qo_len, Hq, D], k [kv_len, Hkv, D], v [kv_len, Hkv, DV] (NHD) -> (o [qo_len, Hq,
    DV], lse [qo_len, Hq]).

    sinks [Hq]: one more logit per head in every row's softmax, with no value. alibi: each
    scaled logit gets slope(head) * (key position - query position) before the soft cap."""
    q, k, v = q.float(), k.float(), v.float()
    qo_len, hq, d = q.shape
    kv_len, hkv, _ = k.shape
    if rope:
        q = rope_llama(q, torch.arange(qo_len) + kv_len - qo_len, rope_scale, rope_theta)
        k = rope_llama(k, torch.arange(kv_len), rope_scale, rope_theta)
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if alibi:
        distance = torch.arange(kv_len)[None, :] - (torch.arange(qo_len)[:, None] + kv_len - qo_len)
        s = s + alibi_slopes(hq)[:, None, None] * distance[None].float()
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    pos = torch.arange(qo_len)[:, None] + kv_len - qo_len
    j = torch.arange(kv_len)[None, :]
    visible = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if causal:
        visible &= j <= pos
    if window_left >= 0:
        visible &= j >= pos - window_left
    if mask is not None:
        visible &= mask
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[:, None, None].expand(hq, qo_len, 1)], dim=-1)
    # A row that sees nothing is 0 with lse -inf; NaN stays NaN, and a +inf logit makes
    # the row NaN (inf - inf in the online softmax's m + log2(sum 2^(s - m))).
    sees = (s != float("-inf")).any(dim=-1, keepdim=True)
    lse = torch.logsumexp(s, dim=-1) / math.log(2)
    lse = lse.masked_fill((s == float("inf")).any(dim=-1), float("nan"))
    p = torch.softmax(s, dim=-1).where(sees, 0.0)[..., :kv_len]
    o = torch.einsum("hqk,khd->qhd", p, v) * v_scale
    return o, lse.transpose(0, 1)


def alibi_slopes(num_heads):
    """FlashInfer's ALiBi slopes: 2^(-8/n)^(1..n) for n the largest power of two <= heads,
    then 2^(-4/n)^(1, 3, 5, ...) for the remaining heads."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, 1 + n))
    if n < num_heads:
        extra = torch.pow(2.0 ** (-4.0 / n), torch.arange(1, 1 + 2 * (num_heads - n), 2))
        slopes = torch.cat([slopes, extra])
    return slopes.float()


def gather_pages(cache, indices, kv_len, kv_layout):
    """A request's [kv_len, H, D] keys (or values) from one paged cache [P, ...]."""
    pages = cache[indices.long()]
    if kv_layout == "HND":
        pages = pages.transpose(1, 2)
    return pages.reshape(-1, pages.shape[2], pages.shape[3])[:kv_len]


TOLERANCE = {
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}
