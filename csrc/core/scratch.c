/* scratch.c: the one table of scratch parameters (workspaces), ours and those of
 * flashinfer-python 0.7.2.post1 (docs/dump-format.md#scratch-tensors). A parameter is
 * scratch when replaying the session with a fresh zero tensor in its place gives the same
 * results as the recording: what the tensor held before the call is never read, or zero is
 * the state the call expects. Each entry names the rule that makes it so; a parameter whose
 * contents a later call reads (state shared across ranks, a plan prepared by another API,
 * a buffer the caller reads back) is not in the table, and is recorded whole. */
#include "scratch.h"

#include <string.h>

#include "pages.h"
#include "tensor.h"

/* Why a fresh zero tensor replays the call as recorded. */
enum {
    /* the call's temporary storage: it reads there only what it wrote itself; a wrapper's
     * __init__ hands it to plan and run, which replay runs again */
    RULE_WORKSPACE,
    /* must be zero at its first use, and every launch leaves it zero (self-resetting
     * counters): a zero tensor is the state the call expects */
    RULE_ZEROED,
    /* a CUDA-graph buffer of a wrapper's __init__: plan copies its tables in (the part run
     * reads) before any run, and replay runs plan again */
    RULE_PLAN_FILLS,
    /* accepted for compatibility and never read */
    RULE_IGNORED,
};

static const char *const RULE_NAMES[] = {"workspace", "zeroed", "plan fills", "ignored"};

typedef struct {
    const char *name;
    int rule;
} scratch_param;

struct fi_scratch_api {
    const char *qualname; /* first: fi_api_table_find reads it */
    scratch_param param[8];
};

#define WS(p) {p, RULE_WORKSPACE}
#define ZEROED(p) {p, RULE_ZEROED}
#define PLAN_FILLS(p) {p, RULE_PLAN_FILLS}
#define IGNORED(p) {p, RULE_IGNORED}
/* trtllm-gen's workspace keeps its multi-CTA counters at zero between launches */
#define TRTLLM_GEN ZEROED("workspace_buffer"), ZEROED("multi_ctas_kv_counter_buffer")

static const fi_scratch_api TABLE[] = {
    /* the batch wrappers' float workspace (the split-k partial results); FlashInfer's
     * int workspace is allocated inside __init__, never passed */
    {"BatchDecodeWithPagedKVCacheWrapper.__init__",
     {WS("float_workspace_buffer"), PLAN_FILLS("paged_kv_indptr_buffer"),
      PLAN_FILLS("paged_kv_indices_buffer"), PLAN_FILLS("paged_kv_last_page_len_buffer")}},
    {"BatchPrefillWithPagedKVCacheWrapper.__init__",
     {WS("float_workspace_buffer"), PLAN_FILLS("qo_indptr_buf"), PLAN_FILLS("paged_kv_indptr_buf"),
      PLAN_FILLS("paged_kv_indices_buf"), PLAN_FILLS("paged_kv_last_page_len_buf"),
      PLAN_FILLS("custom_mask_buf"), PLAN_FILLS("mask_indptr_buf")}},
    {"BatchPrefillWithRaggedKVCacheWrapper.__init__",
     {WS("float_workspace_buffer"), PLAN_FILLS("qo_indptr_buf"), PLAN_FILLS("kv_indptr_buf"),
      PLAN_FILLS("custom_mask_buf"), PLAN_FILLS("mask_indptr_buf")}},
    {"BatchMLAPagedAttentionWrapper.__init__",
     {WS("float_workspace_buffer"), PLAN_FILLS("qo_indptr"), PLAN_FILLS("kv_indptr"),
      PLAN_FILLS("kv_indices"), PLAN_FILLS("kv_len_arr")}},
    {"PODWithPagedKVCacheWrapper.__init__",
     {WS("float_workspace_buffer"), PLAN_FILLS("paged_kv_indptr_buffer"),
      PLAN_FILLS("paged_kv_indices_buffer"), PLAN_FILLS("paged_kv_last_page_len_buffer")}},
    {"BatchPODWithPagedKVCacheWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__", {WS("float_workspace_buffer")}},
    {"MultiLevelCascadeAttentionWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BlockSparseAttentionWrapper.__init__", {WS("float_workspace_buffer")}},
    {"VariableBlockSparseAttentionWrapper.__init__", {WS("float_workspace_buffer")}},
    {"SegmentGEMMWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BatchDecodeCuteDSLWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BatchDecodePagedCuteDSLWrapper.__init__", {WS("float_workspace_buffer")}},
    {"BatchPrefillCuteDSLWrapper.__init__", {IGNORED("float_workspace_buffer")}},
    {"BatchMLADecodeCuteDSLWrapper.__init__", {WS("workspace_buffer")}},
    /* trtllm-gen, xqa and cuDNN attention */
    {"trtllm_batch_decode_with_kv_cache", {TRTLLM_GEN}},
    {"trtllm_batch_context_with_kv_cache", {TRTLLM_GEN}},
    {"trtllm_batch_decode_with_kv_cache_mla", {TRTLLM_GEN}},
    {"trtllm_prefill_with_kv_cache_mla", {TRTLLM_GEN}},
    {"trtllm_fmha_v2_prefill", {WS("workspace_buffer")}},
    {"trtllm_ragged_attention_deepseek", {WS("workspace_buffer")}},
    {"xqa_batch_decode_with_kv_cache", {ZEROED("workspace_buffer")}},
    {"xqa_batch_decode_with_kv_cache_mla", {WS("workspace_buffer")}},
    {"xqa", {WS("workspace_buffer")}},
    {"xqa_mla", {WS("workspace_buffer")}},
    {"cudnn_batch_decode_with_kv_cache", {WS("workspace_buffer")}},
    {"cudnn_batch_prefill_with_kv_cache", {WS("workspace_buffer")}},
    /* MoE, GEMM and the fused kernels with a caller-owned scratch */
    {"cutlass_fused_moe", {WS("workspace_buffer")}},
    {"mono_moe", {WS("scratchpad")}},
    {"cute_dsl_fused_moe_bf16", {WS("intermediate_buffer")}},
    {"cake_rmsnorm_train_backward", {WS("workspace")}},
    {"minimax_h3_bf16_pre_attention", {WS("workspace")}},
    {"dsa_indexer_topk", {WS("workspace_buffer")}},
    {"bsa_attn_sm120_blk64_sage_fwd", {IGNORED("tma_descriptor_workspace")}},
};

#define TABLE_LEN (sizeof TABLE / sizeof TABLE[0])

const fi_scratch_api *fi_scratch_api_of(PyObject *func)
{
    return fi_api_table_find(func, TABLE, TABLE_LEN, sizeof TABLE[0]);
}

int fi_scratch_arg(const fi_scratch_api *api, const fi_call_args *a, Py_ssize_t i)
{
    PyObject *name = i < a->nargs ? (i < a->nparams ? a->param_names[i] : NULL)
                     : a->kwnames ? PyTuple_GET_ITEM(a->kwnames, i - a->nargs)
                                  : NULL;
    const char *s = name ? PyUnicode_AsUTF8(name) : NULL;
    if (!s) {
        PyErr_Clear();
        return 0;
    }
    for (int k = 0; k < 8 && api->param[k].name; k++)
        if (strcmp(s, api->param[k].name) == 0)
            return 1;
    return 0;
}

int fi_scratch_exec(PyObject *module)
{
    PyObject *rows = PyList_New(0);
    for (size_t i = 0; rows && i < TABLE_LEN; i++)
        for (int k = 0; k < 8 && TABLE[i].param[k].name; k++) {
            PyObject *row = Py_BuildValue("(sss)", TABLE[i].qualname, TABLE[i].param[k].name,
                                          RULE_NAMES[TABLE[i].param[k].rule]);
            if (!row || PyList_Append(rows, row) < 0)
                Py_CLEAR(rows);
            Py_XDECREF(row);
            if (!rows)
                break;
        }
    PyObject *table = rows ? PyList_AsTuple(rows) : NULL;
    Py_XDECREF(rows);
    int r = table ? PyModule_AddObjectRef(module, "SCRATCH_PARAMETERS", table) : -1;
    Py_XDECREF(table);
    return r;
}
