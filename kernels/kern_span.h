/* kern_span: a run of floats inside one buffer, the unit of a bucketed
 * all-reduce (kern_comm.h). Plain data, shared by the communicators. */
#ifndef ACC_KERN_SPAN_H
#define ACC_KERN_SPAN_H

#include <stddef.h>

/* `n` floats at offset `off` (in floats) of a buffer. */
typedef struct kern_span {
    size_t off, n;
} kern_span;

/* Most spans in one kern_comm_reduce_start (one NCCL group). */
#define KERN_COMM_MAX_SPANS 64

#endif
