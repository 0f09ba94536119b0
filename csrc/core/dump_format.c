/* dump_format.c: _C.DUMP_FORMAT, the names and bounds of dump_format.h and the fields of a
 * record as the recorder writes them (docs/dump-format.md#record-fields), for the test that
 * holds them equal to flashinfer_native/record.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>

#include "dump_format.h"

/* Every field the recorder writes: a call's record (dump.c, dump_files.c), its CUDA graph
 * snapshots (graph_capture.c), a trigger record (crash_writer.c), a skip record
 * (record_dirs.c) and the keys
 * static_meta["record_extras"] adds (flashinfer_native/distributed.py). */
static const char *const record_fields[] = {
    "function_name",
    "module",
    "call_sequence",
    "timestamp",
    "process_id",
    "input_metadata",
    "output_metadata",
    "tensor_info",
    "tensor_details",
    "tensor_format",
    "function_signature",
    "versions",
    "execution_status",
    "graph_capture",
    "dump_dir",
    "self_id",
    "sequence",
    "distributed",
    "exception",
    "outputs_skipped",
    "tensors_skipped",
    "graph_capture_flushed",
    "graph_capture_flush_index",
    "graph_capture_snapshot_dir",
    "graph_capture_base_dump_dir",
    "record_type",
    "trigger",
    "signal",
    "time",
    "calls_written",
    "duration_us",
    "reason",
    "calls_skipped",
};

/* The keys of a record's tensor_info (dump.c), of each tensor_details entry
 * (dump_encode.c) and of its exception (dump.c). */
static const char *const tensor_info_fields[] = {
    "input_tensor_keys", "output_tensor_keys", "input_size_bytes", "input_size_mb",
    "output_size_bytes", "output_size_mb",     "total_size_bytes", "total_size_mb",
};
static const char *const tensor_detail_fields[] = {"shape", "dtype", "stride", "device"};
static const char *const exception_fields[] = {"type", "message"};
/* The keys of a compact manifest (compact.c, crash_writer.c) and of each of its tensors. */
static const char *const manifest_fields[] = {"format", "version", "packs", "tensors"};
static const char *const manifest_tensor_fields[] = {
    "dtype", "shape", "stride", "requires_grad", "span_bytes", "pages", "chunks",
};
/* The values of execution_status (dump.c, graph_capture.c). */
static const char *const execution_statuses[] = {"inputs_saved", "completed", "exception",
                                                 "graph_capture_pending_flush"};

#define FIELDS_TUPLE(array) fields_tuple(array, (Py_ssize_t)(sizeof array / sizeof array[0]))

static PyObject *fields_tuple(const char *const *fields, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(fields[i]);
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

int fi_dump_format_exec(PyObject *module)
{
    PyObject *fields = FIELDS_TUPLE(record_fields);
    PyObject *info = FIELDS_TUPLE(tensor_info_fields);
    PyObject *detail = FIELDS_TUPLE(tensor_detail_fields);
    PyObject *exception = FIELDS_TUPLE(exception_fields);
    PyObject *statuses = FIELDS_TUPLE(execution_statuses);
    PyObject *manifest = FIELDS_TUPLE(manifest_fields);
    PyObject *manifest_tensor = FIELDS_TUPLE(manifest_tensor_fields);
    if (!fields || !info || !detail || !exception || !statuses || !manifest || !manifest_tensor) {
        Py_XDECREF(fields);
        Py_XDECREF(info);
        Py_XDECREF(detail);
        Py_XDECREF(exception);
        Py_XDECREF(statuses);
        Py_XDECREF(manifest);
        Py_XDECREF(manifest_tensor);
        return -1;
    }
    PyObject *d = Py_BuildValue(
        "{s:s,s:s,s:s,s:s,s:{s:s,s:s,s:s},s:s,s:s,s:s,s:s,s:i,s:N,s:N,s:s,s:s,s:i,s:s,s:s,s:s,s:i,"
        "s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:i,s:N,s:N,s:N,s:N,s:N}",
        "session_file", FI_DUMP_SESSION_FILE, "metadata_file", FI_DUMP_METADATA_FILE, "inputs",
        FI_DUMP_INPUTS, "outputs", FI_DUMP_OUTPUTS, "tensor_extensions", FI_DUMP_FORMAT_TORCH,
        FI_DUMP_EXT_TORCH, FI_DUMP_FORMAT_SAFETENSORS, FI_DUMP_EXT_SAFETENSORS,
        FI_DUMP_FORMAT_CHUNKS, FI_DUMP_EXT_CHUNKS, "chunks_dir", FI_DUMP_CHUNKS_DIR, "pack_ext",
        FI_DUMP_PACK_EXT, "ring_pack_prefix", FI_DUMP_RING_PACK_PREFIX, "manifest_format",
        FI_COMPACT_FORMAT, "manifest_version", atoi(FI_COMPACT_VERSION), "manifest_fields",
        manifest, "manifest_tensor_fields", manifest_tensor, "graph_flushes", FI_DUMP_GRAPH_FLUSHES,
        "flush_prefix", FI_DUMP_FLUSH_PREFIX, "flush_digits", atoi(FI_DUMP_FLUSH_DIGITS),
        "stamp_format", FI_DUMP_STAMP_FORMAT, "pid_mark", FI_DUMP_PID_MARK, "call_mark",
        FI_DUMP_CALL_MARK, "call_digits", atoi(FI_DUMP_CALL_DIGITS), "name_chars",
        FI_DUMP_NAME_CHARS, "arg_prefix", FI_KEY_ARG, "kwarg_prefix", FI_KEY_KWARG, "result_key",
        FI_KEY_RESULT, "nested_separator", FI_KEY_NESTED, "dict_key_mark", FI_KEY_DICT_KEY,
        "dict_value_mark", FI_KEY_DICT_VALUE, "max_items", FI_DUMP_MAX_ITEMS, "repr_limit",
        FI_DUMP_REPR_LIMIT, "record_fields", fields, "tensor_info_fields", info,
        "tensor_detail_fields", detail, "exception_fields", exception, "execution_statuses",
        statuses);
    if (!d)
        return -1;
    int r = PyModule_AddObjectRef(module, "DUMP_FORMAT", d);
    Py_DECREF(d);
    return r;
}
