/* rng: splitmix64 (Steele, Lea, Flood 2014), a 64-bit state generator that
 * passes BigCrush; good enough for init and shuffling, and trivially seeded. */
#include "rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(rng *r, uint64_t seed, uint64_t stream)
{
    /* distinct streams for one seed: hash the pair */
    r->s = mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ULL));
}

uint64_t rng_u64(rng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    return mix64(r->s);
}

uint64_t rng_below(rng *r, uint64_t n)
{
    if (n <= 1)
        return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = rng_u64(r);
    while (x >= limit);
    return x % n;
}

double rng_uniform(rng *r)
{
    return ((double)(rng_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double rng_normal(rng *r)
{
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
