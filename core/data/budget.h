/* budget: the clock behind the time bound of work on untrusted input
 * (template rendering, tokenizer normalizers and regexes; docs/data.md
 * "Limits on untrusted input").
 *
 * Contract: a deadline is an absolute CLOCK_MONOTONIC time in nanoseconds;
 * 0 means none. budget_after_ms(0) is 0 (no bound). budget_expired() is
 * cheap enough (vDSO) to call between regex matches and loop iterations;
 * tight loops call it every few hundred iterations.
 */
#ifndef ACC_BUDGET_H
#define ACC_BUDGET_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static inline int64_t budget_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The deadline `ms` milliseconds from now; 0 (none) for ms <= 0. */
static inline int64_t budget_after_ms(long ms)
{
    return ms > 0 ? budget_now_ns() + (int64_t)ms * 1000000 : 0;
}

static inline bool budget_expired(int64_t deadline_ns)
{
    return deadline_ns != 0 && budget_now_ns() > deadline_ns;
}

#endif
