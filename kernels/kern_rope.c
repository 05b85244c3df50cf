/* kern_rope: see kern_rope.h. Everything in double; the tables are rounded
 * to float once at the end. */
#include "kern_rope.h"

#include <math.h>
#include <stdint.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

static int bad(acc_err *err, const char *field, const char *what, double v)
{
    return acc_err_set(err, ACC_EINVAL, field, "%s: %s, got %g", field, what, v);
}

int kern_rope_check(const kern_rope_cfg *cfg, int hs, acc_err *err)
{
    if (hs < 2 || hs % 2 != 0)
        return acc_err_set(err, ACC_EINVAL, "head_dim",
                           "head_dim: rotary embedding needs an even head size >= 2, got %d", hs);
    if (!isfinite(cfg->theta) || cfg->theta <= 0.0)
        return bad(err, "rope_theta", "must be a positive number", cfg->theta);
    switch (cfg->type) {
    case KERN_ROPE_NONE:
        return 0;
    case KERN_ROPE_LINEAR:
        if (!isfinite(cfg->factor) || cfg->factor <= 0.0)
            return bad(err, "rope_scaling.factor", "must be a positive number", cfg->factor);
        return 0;
    case KERN_ROPE_LLAMA3:
        if (!isfinite(cfg->factor) || cfg->factor <= 0.0)
            return bad(err, "rope_scaling.factor", "must be a positive number", cfg->factor);
        if (!isfinite(cfg->low_freq_factor) || cfg->low_freq_factor <= 0.0)
            return bad(err, "rope_scaling.low_freq_factor", "must be a positive number",
                       cfg->low_freq_factor);
        if (!isfinite(cfg->high_freq_factor) || cfg->high_freq_factor <= cfg->low_freq_factor)
            return bad(err, "rope_scaling.high_freq_factor",
                       "must be a number above low_freq_factor", cfg->high_freq_factor);
        if (cfg->original_max_pos <= 0)
            return bad(err, "rope_scaling.original_max_position_embeddings",
                       "must be a positive integer", (double)cfg->original_max_pos);
        return 0;
    }
    return acc_err_set(err, ACC_EINVAL, "rope_scaling.rope_type", "unknown rope scaling type %d",
                       (int)cfg->type);
}

/* llama3: keep the short wavelengths, scale the long ones, blend between */
static double llama3_freq(const kern_rope_cfg *cfg, double f)
{
    double L = (double)cfg->original_max_pos;
    double wavelen = 2.0 * M_PI / f;
    if (wavelen < L / cfg->high_freq_factor)
        return f;
    if (wavelen > L / cfg->low_freq_factor)
        return f / cfg->factor;
    double s = (L / wavelen - cfg->low_freq_factor) /
               (cfg->high_freq_factor - cfg->low_freq_factor);
    return (1.0 - s) * f / cfg->factor + s * f;
}

int kern_rope_inv_freq(const kern_rope_cfg *cfg, int hs, double *inv_freq, acc_err *err)
{
    int rc = kern_rope_check(cfg, hs, err);
    if (rc != 0)
        return rc;
    for (int i = 0; i < hs / 2; i++) {
        double f = pow(cfg->theta, -2.0 * i / hs);
        if (cfg->type == KERN_ROPE_LINEAR)
            f /= cfg->factor;
        else if (cfg->type == KERN_ROPE_LLAMA3)
            f = llama3_freq(cfg, f);
        inv_freq[i] = f;
    }
    return 0;
}

int kern_rope_table_floats(int P, int hs, size_t *out, acc_err *err)
{
    *out = 0;
    if (P < 1)
        return acc_err_set(err, ACC_EINVAL, "max_position_embeddings",
                           "rotary table: need at least one position, got %d", P);
    if (hs < 2 || hs % 2 != 0)
        return acc_err_set(err, ACC_EINVAL, "head_dim",
                           "head_dim: rotary embedding needs an even head size >= 2, got %d", hs);
    size_t half = (size_t)hs / 2;
    if ((size_t)P > SIZE_MAX / sizeof(float) / half)
        return acc_err_set(err, ACC_EINVAL, "max_position_embeddings",
                           "rotary table of %d positions x %zu overflows", P, half);
    *out = (size_t)P * half;
    return 0;
}

int kern_rope_table(const kern_rope_cfg *cfg, int P, int hs, float *cos_t, float *sin_t,
                    acc_err *err)
{
    size_t n = 0;
    int rc = kern_rope_table_floats(P, hs, &n, err);
    if (rc != 0 || (rc = kern_rope_check(cfg, hs, err)) != 0)
        return rc;
    enum { MAX_HALF = 4096 }; /* head sizes up to 8192 without an allocation */
    int half = hs / 2;
    if (half > MAX_HALF)
        return acc_err_set(err, ACC_EINVAL, "head_dim", "head_dim %d: above %d", hs,
                           2 * MAX_HALF);
    double inv[MAX_HALF];
    if ((rc = kern_rope_inv_freq(cfg, hs, inv, err)) != 0)
        return rc;
    for (int p = 0; p < P; p++)
        for (int i = 0; i < half; i++) {
            double a = (double)p * inv[i];
            cos_t[(size_t)p * half + i] = (float)cos(a);
            sin_t[(size_t)p * half + i] = (float)sin(a);
        }
    return 0;
}
