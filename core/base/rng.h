/* rng: small deterministic random numbers (splitmix64), one state per user.
 *
 * Used where the engine needs reproducible randomness: weight init from the
 * job's seed and the per-epoch sample order. Same seed, same sequence, on
 * every machine; no global state.
 */
#ifndef ACC_RNG_H
#define ACC_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s;
} rng;

void rng_seed(rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_u64(rng *r);
/* uniform in [0, n) without modulo bias */
uint64_t rng_below(rng *r, uint64_t n);
/* uniform in (0, 1) */
double rng_uniform(rng *r);
/* standard normal (Box-Muller) */
double rng_normal(rng *r);

#endif
