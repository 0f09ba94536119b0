/* format_json.h: the JSON log format (FLASHINFER_LOGFORMAT=json): record heads and
 * Python values as JSON, encoded as in the dump metadata (docs/dump-format.md#value-encoding)
 * plus statistics. */
#ifndef FI_FORMAT_JSON_H
#define FI_FORMAT_JSON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "call.h"
#include "strbuf.h"

/* Opens a record: {"event": EVENT[, "api": API][, "call_id": N], "timestamp": seconds
 * since the epoch (microseconds), "pid": P. api may be NULL, call_id < 0 leaves it out.
 * The caller appends ", key: value" fields and closes it with fi_format_json_close. */
int fi_format_json_head(fi_buf *b, const char *event, const char *api, long long call_id);

/* Appends "}\n". Returns -1 (MemoryError set) when the buffer ran out of memory. */
int fi_format_json_close(fi_buf *b);

/* Appends ", \"key\": " (key plain ASCII). */
int fi_format_json_key(fi_buf *b, const char *key);

/* Appends value as JSON: None/bool/int/float/str as themselves, tensors as
 * {"type": "torch.Tensor", shape, stride, dtype, device, requires_grad, is_contiguous}
 * (at the call's level 5 and above "stats", or "stats_error"/"stats_skipped"/
 * "stats_deferred"), dtypes, devices, enums, lists/tuples/dicts and reprs as the metadata
 * records encode them. -1 with an exception set only for failures outside a value's own
 * repr. */
int fi_format_json_value(fi_buf *b, PyObject *value, fi_call *call);

/* Registers the fork handler that refreshes the cached process id. */
int fi_format_json_exec(PyObject *module);

#endif
