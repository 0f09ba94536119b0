/* dump_format.h: the names and bounds of a level-10 dump as the recorder writes them
 * (docs/dump-format.md). The reader's side is flashinfer_native/record.py; the module
 * exports these as _C.DUMP_FORMAT and tests/test_dump_format.py holds the two equal and
 * reads a written dump back. */
#ifndef FI_DUMP_FORMAT_H
#define FI_DUMP_FORMAT_H

#include "compact_names.h"

/* Files of the root and of a call directory. */
#define FI_DUMP_SESSION_FILE "session.jsonl"
#define FI_DUMP_METADATA_FILE "metadata.jsonl"
#define FI_DUMP_INPUTS "inputs"
#define FI_DUMP_OUTPUTS "outputs"
#define FI_DUMP_FORMAT_TORCH "torch" /* the record's tensor_format */
#define FI_DUMP_FORMAT_SAFETENSORS "safetensors"
#define FI_DUMP_FORMAT_CHUNKS "chunks" /* the compact layout's manifests, below */
#define FI_DUMP_EXT_TORCH "pt"         /* tensor_format "torch" */
#define FI_DUMP_EXT_SAFETENSORS "safetensors"
#define FI_DUMP_GRAPH_FLUSHES "graph_flushes" /* CUDA graph snapshots: .../flush_NNNN/ */
#define FI_DUMP_FLUSH_PREFIX "flush_"
#define FI_DUMP_FLUSH_DIGITS "4"

/* The compact layout (docs/dump-format.md#compact-layout): a call's tensors as a manifest
 * (CALL/inputs.FI_DUMP_EXT_CHUNKS, tensor_format "chunks") of chunks in packs under
 * ROOT/FI_DUMP_CHUNKS_DIR/. The tensor files' layer reads and writes these names too, so
 * they are its macros (compact_names.h), named here for the dump. */
#define FI_DUMP_EXT_CHUNKS FI_COMPACT_MANIFEST_EXT /* tensor_format "chunks" */
#define FI_DUMP_CHUNKS_DIR FI_COMPACT_CHUNKS_DIR
#define FI_DUMP_PACK_EXT FI_COMPACT_PACK_EXT
#define FI_DUMP_RING_PACK_PREFIX "ring-" /* a ring's packs: ring-PID-NS-K.pack */

/* A call directory: STAMP _pid PID _ NAME _call N, N at least FI_DUMP_CALL_DIGITS digits;
 * STAMP is strftime(FI_DUMP_STAMP_FORMAT) then '_' and the milliseconds in 3 digits; NAME
 * keeps FI_DUMP_NAME_CHARS and has every other character replaced by '_'. */
#define FI_DUMP_STAMP_FORMAT "%Y%m%d_%H%M%S"
#define FI_DUMP_PID_MARK "_pid"
#define FI_DUMP_CALL_MARK "_call"
#define FI_DUMP_CALL_DIGITS "4"
#define FI_DUMP_NAME_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"
#define FI_DUMP_DIR_FORMAT                                                                         \
    "%s/%s" FI_DUMP_PID_MARK "%ld_%s" FI_DUMP_CALL_MARK "%0" FI_DUMP_CALL_DIGITS "lld"

/* Argument keys (docs/dump-format.md#argument-keys). */
#define FI_KEY_ARG "arg_"
#define FI_KEY_KWARG "kwarg_"
#define FI_KEY_RESULT "result"
#define FI_KEY_NESTED "__"
#define FI_KEY_DICT_KEY "key_"
#define FI_KEY_DICT_VALUE "value_"

/* Bounds of the writer: items kept of one list, tuple or dict; characters of a repr. */
#define FI_DUMP_MAX_ITEMS 10000
#define FI_DUMP_REPR_LIMIT 1000

/* Adds DUMP_FORMAT, a dict of the constants above and the record fields the recorder
 * writes, to the module (a PyObject; declared without Python.h, which the async-signal-safe
 * crash writer does not include). */
struct _object;
int fi_dump_format_exec(struct _object *module);

#endif
