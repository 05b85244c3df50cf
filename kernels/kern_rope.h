/* kern_rope: the rotary position embedding's cos / sin tables, on the host.
 *
 * The kern_ops rope_fwd / rope_bwd kernels (kern_device.h) rotate pair
 * (i, i + hs/2) of each head by the angle p * inv_freq[i]; this module
 * computes inv_freq from a Hugging Face config's `rope_theta` and
 * `rope_scaling`, and the [P, hs/2] tables cos(p * inv_freq[i]),
 * sin(p * inv_freq[i]) for positions p = 0 .. P-1, in double, rounded once
 * to float. Pure functions: the model and the tests share them; the model
 * uploads the tables to its device.
 *
 *   inv_freq[i] = theta^(-2i / hs)                    (no scaling, "default")
 *   linear:  positions divided by `factor`, i.e. inv_freq[i] / factor
 *   llama3:  with L = original_max_position_embeddings and the wavelength
 *            w = 2 pi / inv_freq[i]:
 *              w < L / high_freq_factor  -> inv_freq[i]           (kept)
 *              w > L / low_freq_factor   -> inv_freq[i] / factor  (scaled)
 *              otherwise, s = (L / w - low_freq_factor)
 *                             / (high_freq_factor - low_freq_factor):
 *                 (1 - s) * inv_freq[i] / factor + s * inv_freq[i]
 *   (Meta's Llama 3.1 definition; no attention factor: cos / sin unscaled.)
 *
 * Errors (ACC_EINVAL, field = the config key): theta <= 0 or not finite,
 * hs odd or < 2, factor <= 0 (linear, llama3), low_freq_factor <= 0,
 * high_freq_factor <= low_freq_factor, original_max_position_embeddings
 * <= 0 (llama3), P < 1, P * hs / 2 overflowing size_t.
 */
#ifndef ACC_KERN_ROPE_H
#define ACC_KERN_ROPE_H

#include <stddef.h>

#include "err.h"

typedef enum kern_rope_type {
    KERN_ROPE_NONE = 0, /* rope_scaling absent / null / "default" */
    KERN_ROPE_LINEAR,   /* {"rope_type": "linear", "factor"} */
    KERN_ROPE_LLAMA3,   /* {"rope_type": "llama3", "factor", "low_freq_factor",
                         *  "high_freq_factor", "original_max_position_embeddings"} */
} kern_rope_type;

typedef struct kern_rope_cfg {
    double theta;              /* rope_theta: 10000 (LLaMA-2), 500000 (LLaMA-3) */
    kern_rope_type type;
    double factor;             /* linear, llama3 */
    double low_freq_factor;    /* llama3 */
    double high_freq_factor;   /* llama3 */
    int original_max_pos;      /* llama3: original_max_position_embeddings */
} kern_rope_cfg;

/* 0 when cfg and hs can make tables, else ACC_EINVAL naming the key. */
int kern_rope_check(const kern_rope_cfg *cfg, int hs, acc_err *err);

/* inv_freq[0 .. hs/2) as defined above (checks cfg first). */
int kern_rope_inv_freq(const kern_rope_cfg *cfg, int hs, double *inv_freq, acc_err *err);

/* cos_t[p * hs/2 + i] = cos(p * inv_freq[i]), sin_t likewise, p < P; each
 * table KERN_ROPE_TABLE(P, hs) floats (P * hs / 2; check with
 * kern_rope_table_floats for sizes from user numbers). */
int kern_rope_table(const kern_rope_cfg *cfg, int P, int hs, float *cos_t, float *sin_t,
                    acc_err *err);

/* P * hs / 2 into *out, or ACC_EINVAL when P < 1, hs odd / < 2, or it overflows. */
int kern_rope_table_floats(int P, int hs, size_t *out, acc_err *err);

#define KERN_ROPE_TABLE(P, hs) ((size_t)(P) * (size_t)((hs) / 2))

#endif
