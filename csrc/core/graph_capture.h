/* graph_capture.h: calls recorded while a CUDA graph is captured. No device-to-host copy may
 * run then, so their tensors are held and written after each replay of the graph, as
 * FlashInfer does (docs/flight-recorder.md). */
#ifndef FI_GRAPH_CAPTURE_H
#define FI_GRAPH_CAPTURE_H

#include "recorder.h"

/* Holds a captured call's record and input tensors, with the graph being captured
 * (rec->capture_graph). -1 with an exception set. */
int fi_graph_hold(fi_dump_call *call, PyObject *inputs);
/* The held call returned: its outputs are held too. */
void fi_graph_hold_outputs(fi_dump_call *call, PyObject *outputs);
/* The held call's record is complete (line 2): the flushes repeat it. -1 MemoryError. */
int fi_graph_hold_record(fi_dump_call *call);
/* The held call raised: nothing to flush. */
void fi_graph_drop(fi_dump_call *call);

/* Writes the held tensors (their current values) of the calls captured into graph (its
 * id; NULL or None: any) as a new snapshot: per part (inputs, outputs) the root file
 * refreshed, graph_flushes/flush_NNNN/<part> written and its records. Returns the parts
 * written; a call that fails is logged and skipped. -1 with an exception set. */
Py_ssize_t fi_graph_flush(fi_recorder *rec, PyObject *graph);

/* The parts (inputs, outputs) fi_graph_flush(rec, graph) would write now. */
Py_ssize_t fi_graph_pending(fi_recorder *rec, PyObject *graph);

/* Forgets the held calls; returns the parts they held, -1 with an exception set. */
Py_ssize_t fi_graph_clear(fi_recorder *rec);

#endif
