/* compact_names.h: the names of the compact layout (docs/dump-format.md, "Compact layout")
 * that the tensor files' layer reads and writes itself: the chunks folder beside the call
 * directories, the suffixes of a manifest and of a pack, and the manifest's format tag.
 * Macros only, so that both this layer (compact.c) and the core's dump_format.h, which
 * names them for the dump and exports them as _C.DUMP_FORMAT, include it. */
#ifndef FI_COMPACT_NAMES_H
#define FI_COMPACT_NAMES_H

#define FI_COMPACT_CHUNKS_DIR "chunks"        /* ROOT/chunks/ holds the packs */
#define FI_COMPACT_MANIFEST_EXT "chunks.json" /* CALL/inputs.chunks.json */
#define FI_COMPACT_PACK_EXT "pack"            /* ROOT/chunks/NAME.pack */
#define FI_COMPACT_FORMAT "flashinfer-native chunks"
#define FI_COMPACT_VERSION "1" /* the manifest's "version", a JSON number */

#endif
