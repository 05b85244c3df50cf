/* memfind: substring search for work on untrusted input.
 *
 * Contract: memfind(hay, hn, from, needle, nn) is the offset of the first
 * needle[0..nn) in hay[from..hn), or -1; nn == 0 finds `from`. Linear: it
 * asks memmem (glibc's two-way search) about windows that double from the
 * start, so a search that finds its match d bytes on costs O(d + nn) --
 * also under AddressSanitizer, whose memmem checks the whole haystack it is
 * given (a search per match over a long text would be quadratic).
 */
#ifndef ACC_MEMFIND_H
#define ACC_MEMFIND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline int64_t memfind(const char *hay, size_t hn, size_t from, const char *needle, size_t nn)
{
    if (from > hn || nn > hn - from)
        return -1;
    if (nn == 0)
        return (int64_t)from;
    size_t pos = from, w = 2 * nn + 256;
    for (;;) {
        size_t len = hn - pos < w ? hn - pos : w;
        const char *hit = memmem(hay + pos, len, needle, nn);
        if (hit != NULL)
            return (int64_t)(hit - hay);
        if (len == hn - pos)
            return -1;
        pos += len - nn + 1; /* the next window overlaps by nn - 1 bytes */
        w = w > SIZE_MAX / 2 ? w : 2 * w;
    }
}

#endif
