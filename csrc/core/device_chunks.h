/* device_chunks.h: the flight recorder's compact capture on the device
 * (docs/flight-recorder.md, "Chunk dedup on the device"): a CUDA tensor's chunks are
 * hashed on its device and only the chunks the chunk store lacks are copied to the host. */
#ifndef FI_DEVICE_CHUNKS_H
#define FI_DEVICE_CHUNKS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "recorder.h"
#include "tensorio.h"

/* The device path of a recorded call's compact capture: the CUDA one in a build with the
 * CUDA kernels (until a device call fails: the host path is then taken for the rest of the
 * process, with one warning), the test device while a test has switched it on (CPU tensors
 * through the same steps), else NULL. Guarded by the GIL. */
fi_chunk_device *fi_device_chunks(void);

/* After a capture through dev failed with an exception set: 1 when a device call failed in it
 * (dev->failures is past before), the exception then written to rec's log as a warning and
 * cleared, for the caller to take the capture again on the host; else 0. */
int fi_device_chunks_gave_up(fi_recorder *rec, const fi_chunk_device *dev, unsigned before);

/* Adds _device_chunks (counters and the test switch) to the module. */
int fi_device_chunks_exec(PyObject *module);

#endif
