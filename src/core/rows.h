/*
 * core/rows.h — internal: copying a block of equal rows between two strided layouts at memory bandwidth.
 *
 * The collectives' packs and unpacks (run/redist.c, the one-process backend in comm/comm.c) move [rows, bytes]
 * blocks whose rows sit `stride` bytes apart on one side. One memcpy per row, the rows split over the OpenMP
 * threads when the block is large enough to pay for waking them.
 */
#ifndef HP_CORE_ROWS_H
#define HP_CORE_ROWS_H

#include <stddef.h>

/* Row i of src (at src + i * src_stride, `bytes` long) to dst + i * dst_stride, for i < rows. The ranges must
 * not overlap. */
void hp__copy_rows(void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t rows, size_t bytes);

/* As hp__copy_rows into two destinations at once, each row read once: in pieces of at most 64 KiB, each written
 * to dst and then to dst2 while it is still in cache. */
void hp__copy_rows2(void *dst, size_t dst_stride, void *dst2, size_t dst2_stride, const void *src, size_t src_stride,
                    size_t rows, size_t bytes);

#endif
