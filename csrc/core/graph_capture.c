/* graph_capture.c: calls recorded while a CUDA graph is captured: their tensors held with
 * the graph, and written as snapshots after each replay (flush), as FlashInfer does. */
#include "graph_capture.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dump_encode.h"
#include "dump_format.h"
#include "record_mode.h"
#include "sink.h"

/* A held call. It lives in a capsule in the recorder's graph_pending list until
 * fi_graph_clear. */
typedef struct fi_graph_entry {
    char *dir;         /* the call's directory */
    fi_record record;  /* the line-1 record, then line 2 once the call returned */
    char *name;        /* the API name */
    PyObject *inputs;  /* key -> tensor */
    PyObject *outputs; /* key -> tensor; NULL until the call returned */
    PyObject *graph;   /* id of the CUDAGraph captured (graph_hooks), or None */
    long flushes;      /* snapshots taken so far */
} graph_entry;

#define GRAPH_ENTRY_CAPSULE "flashinfer_native.graph_entry"

static void graph_entry_free(graph_entry *e)
{
    fi_record_free(&e->record);
    free(e->name);
    Py_XDECREF(e->inputs);
    Py_XDECREF(e->outputs);
    Py_XDECREF(e->graph);
    free(e->dir);
    free(e);
}

static void graph_capsule_free(PyObject *capsule)
{
    graph_entry_free(PyCapsule_GetPointer(capsule, GRAPH_ENTRY_CAPSULE));
}

/* Holds a captured call's record and input tensors in graph_pending for the flushes,
 * with the graph being captured. */
int fi_graph_hold(fi_dump_call *call, PyObject *inputs)
{
    graph_entry *e = calloc(1, sizeof(*e));
    const char *name = PyUnicode_AsUTF8(call->name);
    if (e)
        fi_record_init(&e->record);
    if (!e || !name || !(e->dir = strdup(call->dir)) || !(e->name = strdup(name)) ||
        fi_record_copy(&e->record, &call->record) < 0) {
        if (e)
            graph_entry_free(e);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    e->inputs = Py_NewRef(inputs);
    e->graph = Py_NewRef(call->rec->capture_graph ? call->rec->capture_graph : Py_None);
    call->graph_capsule = PyCapsule_New(e, GRAPH_ENTRY_CAPSULE, graph_capsule_free);
    if (!call->graph_capsule) {
        graph_entry_free(e);
        return -1;
    }
    call->graph = e;
    return PyList_Append(call->rec->graph_pending, call->graph_capsule);
}

int fi_graph_hold_record(fi_dump_call *call)
{
    fi_record copy;
    if (fi_record_copy(&copy, &call->record) < 0)
        return -1;
    fi_record_move(&call->graph->record, &copy);
    return 0;
}

void fi_graph_hold_outputs(fi_dump_call *call, PyObject *outputs)
{
    Py_XSETREF(call->graph->outputs, Py_NewRef(outputs));
}

/* Removes a captured call from the pending list (it raised: nothing to flush). */
void fi_graph_drop(fi_dump_call *call)
{
    PyObject *pending = call->rec->graph_pending;
    for (Py_ssize_t i = PyList_GET_SIZE(pending) - 1; i >= 0; i--)
        if (PyList_GET_ITEM(pending, i) == call->graph_capsule)
            PyList_SetSlice(pending, i, i + 1, NULL);
}

/* The two records FlashInfer appends per flushed part of a call: base (the call's latest
 * record) with the flush keys, to the call's metadata.jsonl and session.jsonl, and the
 * same naming the snapshot, to the snapshot's metadata.jsonl and session.jsonl. */
static int write_flush_records(fi_recorder *rec, const fi_record *base, const char *status, long n,
                               const char *dir, const char *snap)
{
    fi_record line, snap_line;
    fi_record_init(&snap_line);
    int r = -1;
    if (fi_record_copy(&line, base) < 0)
        return -1;
    if (fi_record_set_str(&line, "execution_status", status) < 0 ||
        fi_record_set_bool(&line, "graph_capture_flushed", 1) < 0 ||
        fi_record_set_int(&line, "graph_capture_flush_index", n) < 0 ||
        fi_record_set_str(&line, "graph_capture_snapshot_dir", snap) < 0 ||
        fi_dump_write_record_at(rec, dir, NULL, &line) < 0)
        goto done;
    if (fi_record_copy(&snap_line, &line) < 0 ||
        fi_record_set_str(&snap_line, "dump_dir", snap) < 0 ||
        fi_record_set_str(&snap_line, "graph_capture_base_dump_dir", dir) < 0)
        goto done;
    r = fi_dump_write_record_at(rec, snap, NULL, &snap_line);
done:
    fi_record_free(&line);
    fi_record_free(&snap_line);
    return r;
}

/* Whether a held part (inputs or outputs: key -> tensor, or NULL) has tensors to write. */
static int held_part(PyObject *tensors) { return tensors && PyDict_GET_SIZE(tensors) > 0; }

/* One snapshot of a captured call, as FlashInfer writes it: per part (inputs, then
 * outputs) the root file refreshed and graph_flushes/flush_NNNN/<part> written, then
 * the part's records. Adds the parts written to *parts. */
static int flush_entry(fi_recorder *rec, graph_entry *e, Py_ssize_t *parts)
{
    long n = ++e->flushes;
    size_t cap = strlen(e->dir) + 64;
    char *snap = malloc(cap);
    if (!snap) {
        PyErr_NoMemory();
        return -1;
    }
    snprintf(snap, cap,
             "%s/" FI_DUMP_GRAPH_FLUSHES "/" FI_DUMP_FLUSH_PREFIX "%0" FI_DUMP_FLUSH_DIGITS "ld/",
             e->dir, n);
    int r = fi_make_parents(snap, 0700); /* also remakes a call directory wiped meanwhile */
    if (r < 0)
        PyErr_Format(PyExc_OSError, "cannot create %s: %s", snap, strerror(errno));
    snap[strlen(snap) - 1] = '\0';
    const struct {
        PyObject *tensors;
        const char *stem, *status;
    } part[2] = {{e->inputs, FI_DUMP_INPUTS, "inputs_saved"},
                 {e->outputs, FI_DUMP_OUTPUTS, "completed"}};
    for (int i = 0; r == 0 && i < 2; i++) {
        if (!held_part(part[i].tensors))
            continue;
        Py_ssize_t w = fi_dump_save_tensors_at(rec, e->dir, part[i].stem, part[i].tensors, NULL);
        Py_ssize_t w2 =
            w < 0 ? -1 : fi_dump_save_tensors_at(rec, snap, part[i].stem, part[i].tensors, NULL);
        r = w2 < 0 ? -1 : write_flush_records(rec, &e->record, part[i].status, n, e->dir, snap);
        if (r == 0) {
            rec->dump_bytes += w + w2;
            (*parts)++;
        }
    }
    free(snap);
    return r;
}

/* The held call in a graph_pending capsule; NULL (no exception) for anything else. */
static graph_entry *entry_at(PyObject *pending, Py_ssize_t i)
{
    graph_entry *e = PyCapsule_GetPointer(PyList_GET_ITEM(pending, i), GRAPH_ENTRY_CAPSULE);
    if (!e)
        PyErr_Clear();
    return e;
}

/* Whether a held call belongs to graph (NULL or None: every call). */
static int entry_of_graph(const graph_entry *e, PyObject *graph)
{
    if (!graph || graph == Py_None)
        return 1;
    int eq = PyObject_RichCompareBool(e->graph, graph, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

/* The number of parts (inputs, outputs) a flush of graph would write now. */
static Py_ssize_t pending_parts(fi_recorder *rec, PyObject *graph)
{
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rec->graph_pending); i++) {
        graph_entry *e = entry_at(rec->graph_pending, i);
        if (e && entry_of_graph(e, graph))
            parts += held_part(e->inputs) + held_part(e->outputs);
    }
    return parts;
}

Py_ssize_t fi_graph_flush(fi_recorder *rec, PyObject *graph)
{
    PyObject *pending = PySequence_List(rec->graph_pending); /* flushing may run Python code */
    if (!pending)
        return -1;
    Py_ssize_t parts = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        graph_entry *e = entry_at(pending, i);
        if (e && (!entry_of_graph(e, graph) || flush_entry(rec, e, &parts) == 0))
            continue;
        fi_dump_log_error(rec, e ? e->name : "?", "graph flush");
    }
    Py_DECREF(pending);
    return parts;
}

Py_ssize_t fi_graph_pending(fi_recorder *rec, PyObject *graph) { return pending_parts(rec, graph); }

Py_ssize_t fi_graph_clear(fi_recorder *rec)
{
    Py_ssize_t parts = pending_parts(rec, NULL);
    if (PyList_SetSlice(rec->graph_pending, 0, PyList_GET_SIZE(rec->graph_pending), NULL) < 0)
        return -1;
    return parts;
}
