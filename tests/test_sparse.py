"""flashinfer.sparse: block-sparse attention against the dense reference with the BSR
pattern expanded to a mask."""

import pytest
import torch
from attention_reference import attention

import flashinfer

WORKSPACE = torch.empty(0, dtype=torch.uint8)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def bsr_pattern(mb, nb, seed):
    """(indptr, indices, dense block map) of a random pattern, every row block nonempty."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.rand(mb, nb, generator=g) < 0.4
    blocks[:, 0] = True
    indptr = torch.cat([torch.zeros(1), blocks.sum(1).cumsum(0)]).int()
    indices = torch.cat([row.nonzero().flatten() for row in blocks]).int()
    return indptr, indices, blocks


@pytest.mark.parametrize("with_mask", [False, True])
def test_block_sparse_matches_the_dense_masked_reference(with_mask):
    R, C, mb, nb = 4, 8, 3, 5
    indptr, indices, blocks = bsr_pattern(mb, nb, seed=1)
    q, k, v = rand(mb * R, 4, 64, seed=2), rand(nb * C, 2, 64, seed=3), rand(nb * C, 2, 64, seed=4)
    inner = rand(int(indptr[-1]), R, C, seed=5) > -0.5 if with_mask else None
    w = flashinfer.sparse.BlockSparseAttentionWrapper(WORKSPACE)
    w.plan(
        indptr,
        indices,
        mb * R,
        nb * C,
        R,
        C,
        4,
        2,
        64,
        mask=inner,
        q_data_type=torch.float32,
        o_data_type=torch.float32,
    )
    o = w.run(q, k, v)
    dense = blocks.repeat_interleave(R, 0).repeat_interleave(C, 1)
    if with_mask:
        places = [(i, int(j)) for i in range(mb) for j in indices[indptr[i] : indptr[i + 1]]]
        for n, (i, j) in enumerate(places):
            dense[i * R : (i + 1) * R, j * C : (j + 1) * C] = inner[n]
    torch.testing.assert_close(o, attention(q, k, v, mask=dense)[0], rtol=1e-4, atol=1e-4)


def test_variable_block_sparse_matches_the_dense_masked_reference():
    row_sz = torch.tensor([[3, 5], [6, 2]])
    col_sz = torch.tensor([[4, 9, 3], [8, 4, 4]])
    maps = torch.tensor([[[1, 0, 1], [1, 1, 0]], [[0, 1, 1], [1, 0, 0]]], dtype=torch.bool)
    q, k, v = rand(4, 8, 64, seed=6), rand(2, 16, 64, seed=7), rand(2, 16, 64, seed=8)
    w = flashinfer.sparse.VariableBlockSparseAttentionWrapper(WORKSPACE)
    w.plan(maps, row_sz, col_sz, 4, 2, 64, q_data_type=torch.float32)
    o = w.run(q, k, v)
    assert o.shape == (4, 8, 64)
    for h in range(2):
        mask = maps[h].repeat_interleave(row_sz[h], 0).repeat_interleave(col_sz[h], 1)
        want, _ = attention(
            q[2 * h : 2 * h + 2].transpose(0, 1),
            k[h : h + 1].transpose(0, 1),
            v[h : h + 1].transpose(0, 1),
            mask=mask,
        )
        torch.testing.assert_close(o[2 * h : 2 * h + 2], want.transpose(0, 1), rtol=1e-4, atol=1e-4)
