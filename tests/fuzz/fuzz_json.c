/* fuzz_json.c: libFuzzer target for the strict JSON parser (safetensors headers and their
 * __metadata__): whatever it accepts, the JSON writer writes back to text that parses
 * to an equal value. */
#include <string.h>

#include "fuzz_common.h"
#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    PyObject *value = fi_json_parse((const char *)data, size, FUZZ_PATH);
    if (!value) {
        PyErr_Clear();
        return 0;
    }
    fi_buf text;
    fi_buf_init(&text);
    if (fi_json_from_py(&text, value) < 0)
        fuzz_fail("the writer refused a parsed value", 0);
    PyObject *again = fi_json_parse(text.data, text.len, FUZZ_PATH);
    /* Numbers beyond double range parse to infinity, which JSON text cannot hold. */
    int non_finite = strstr(text.data, "Infinity") || strstr(text.data, "NaN");
    if (!again && !non_finite)
        fuzz_fail("the writer's text does not parse back", 0);
    if (again && PyObject_RichCompareBool(value, again, Py_EQ) != 1)
        fuzz_fail("the value changed through the writer and parser", 0);
    PyErr_Clear();
    Py_XDECREF(again);
    Py_DECREF(value);
    fi_buf_free(&text);
    return 0;
}
