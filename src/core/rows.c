/*
 * rows.c — hp__copy_rows (core/rows.h).
 */
#include "core/rows.h"

#include <stdint.h>
#include <string.h>

/* Below 1 MiB one thread copies faster than a team wakes up. */
#define HP__ROWS_PAR_BYTES ((size_t)1 << 20)
/* A contiguous copy is cut into runs of this many bytes (a few per thread, each far above a page). */
#define HP__ROWS_RUN_BYTES ((size_t)1 << 20)

void hp__copy_rows(void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t rows, size_t bytes)
{
    if (!rows || !bytes) return;
    char *d = dst;
    const char *s = src;
    if (dst_stride == bytes && src_stride == bytes) { /* one contiguous run: copied in pieces */
        size_t total = rows * bytes, pieces = (total + HP__ROWS_RUN_BYTES - 1) / HP__ROWS_RUN_BYTES;
#pragma omp parallel for schedule(static) if (pieces > 1)
        for (int64_t i = 0; i < (int64_t)pieces; i++) {
            size_t off = (size_t)i * HP__ROWS_RUN_BYTES, len = total - off < HP__ROWS_RUN_BYTES ? total - off
                                                                                                 : HP__ROWS_RUN_BYTES;
            memcpy(d + off, s + off, len);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (rows > 1 && rows * bytes >= HP__ROWS_PAR_BYTES)
    for (int64_t i = 0; i < (int64_t)rows; i++) memcpy(d + (size_t)i * dst_stride, s + (size_t)i * src_stride, bytes);
}

/* Small enough that a piece written to dst is still in L1/L2 when it is written again to dst2. */
#define HP__ROWS_PIECE_BYTES ((size_t)64 << 10)

void hp__copy_rows2(void *dst, size_t dst_stride, void *dst2, size_t dst2_stride, const void *src, size_t src_stride,
                    size_t rows, size_t bytes)
{
    if (!rows || !bytes) return;
    char *d = dst, *d2 = dst2;
    const char *s = src;
    size_t per = (bytes + HP__ROWS_PIECE_BYTES - 1) / HP__ROWS_PIECE_BYTES, n = rows * per;
#pragma omp parallel for schedule(static) if (n > 1 && rows * bytes >= HP__ROWS_PAR_BYTES)
    for (int64_t k = 0; k < (int64_t)n; k++) {
        size_t i = (size_t)k / per, off = (size_t)k % per * HP__ROWS_PIECE_BYTES;
        size_t len = bytes - off < HP__ROWS_PIECE_BYTES ? bytes - off : HP__ROWS_PIECE_BYTES;
        const char *p = s + i * src_stride + off;
        memcpy(d + i * dst_stride + off, p, len);
        memcpy(d2 + i * dst2_stride + off, p, len);
    }
}
