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

static PyObject *fields_tuple(void)
{
    Py_ssize_t n = (Py_ssize_t)(sizeof record_fields / sizeof record_fields[0]);
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t && i < n; i++) {
        PyObject *s = PyUnicode_FromString(record_fields[i]);
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
    PyObject *fields = fields_tuple();
    if (!fields)
        return -1;
    PyObject *d = Py_BuildValue(
        "{s:s,s:s,s:s,s:s,s:{s:s,s:s},s:s,s:s,s:i,s:s,s:s,s:s,s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,"
        "s:i,s:N}",
        "session_file", FI_DUMP_SESSION_FILE, "metadata_file", FI_DUMP_METADATA_FILE, "inputs",
        FI_DUMP_INPUTS, "outputs", FI_DUMP_OUTPUTS, "tensor_extensions", "torch", FI_DUMP_EXT_TORCH,
        "safetensors", FI_DUMP_EXT_SAFETENSORS, "graph_flushes", FI_DUMP_GRAPH_FLUSHES,
        "flush_prefix", FI_DUMP_FLUSH_PREFIX, "flush_digits", atoi(FI_DUMP_FLUSH_DIGITS),
        "stamp_format", FI_DUMP_STAMP_FORMAT, "pid_mark", FI_DUMP_PID_MARK, "call_mark",
        FI_DUMP_CALL_MARK, "call_digits", atoi(FI_DUMP_CALL_DIGITS), "name_chars",
        FI_DUMP_NAME_CHARS, "arg_prefix", FI_KEY_ARG, "kwarg_prefix", FI_KEY_KWARG, "result_key",
        FI_KEY_RESULT, "nested_separator", FI_KEY_NESTED, "dict_key_mark", FI_KEY_DICT_KEY,
        "dict_value_mark", FI_KEY_DICT_VALUE, "max_items", FI_DUMP_MAX_ITEMS, "repr_limit",
        FI_DUMP_REPR_LIMIT, "record_fields", fields);
    if (!d)
        return -1;
    int r = PyModule_AddObjectRef(module, "DUMP_FORMAT", d);
    Py_DECREF(d);
    return r;
}
