/* dump.c: the level-10 flight recorder. (Being written: the tensor file writers
 * land first; until then no call is dumped.) */
#include "dump.h"

fi_dump_call *fi_dump_begin(fi_logger *lg, const fi_dump_api *api, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames)
{
    (void)lg, (void)api, (void)args, (void)nargs, (void)kwnames;
    return NULL;
}

void fi_dump_end(fi_dump_call *call, PyObject *result) { (void)call, (void)result; }
