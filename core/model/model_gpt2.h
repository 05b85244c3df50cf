/* model_gpt2: GPT-2 on one device (one rank's replica).
 *
 * Architecture: token + learned position embeddings, n_layer pre-LayerNorm
 * blocks (causal multi-head attention, GELU MLP of 4C), a final LayerNorm,
 * and logits through the token embedding (tied weights).
 *
 * Memory, all device allocations through kern_ops.alloc:
 *   params  one buffer, 16 tensors in llm.c's order (wte, wpe, ln1w, ln1b,
 *           qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
 *           fcprojb, lnfw, lnfb), so an llm.c .bin maps onto it directly;
 *   grads   the same layout plus MODEL_GRAD_EXTRA floats (the trainer keeps
 *           the step's loss there so it rides the one all-reduce), summed
 *           in place over micro-steps;
 *   adam_m, adam_v  AdamW moments;
 *   acts    activations for micro_batch x seq_len tokens and one layer's
 *           worth of backward scratch: sized by the micro batch only, so
 *           gradient accumulation costs no memory. They are a separate
 *           allocation (model_acts_alloc / model_acts_free) so a job can
 *           change its micro batch, or switch activation recomputation on,
 *           mid-run after an out-of-memory, keeping weights and optimizer
 *           state. In recompute mode only each block's output on the
 *           residual stream is kept; model_backward re-runs a block's
 *           forward before its backward (about one extra forward of cost).
 * Rows of wte beyond vocab_size (padding) never get probability mass.
 *
 * model_forward(want_grad=1) leaves dloss/dlogits in the logits buffer
 * (per-token weights carry the loss normalisation); model_backward() then
 * adds this micro-batch's gradients to grads.
 */
#ifndef ACC_MODEL_GPT2_H
#define ACC_MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "job_spec.h"
#include "kern_device.h"
#include "kern_span.h"

#define MODEL_NTENSORS 16
#define MODEL_GRAD_EXTRA 16
#define MODEL_LLMC_MAGIC 20240326
#define MODEL_LLMC_VERSION 3

typedef struct model_config {
    int max_seq_len;       /* rows of wpe */
    int vocab_size;
    int padded_vocab_size; /* rows of wte */
    int n_layer, n_head, channels;
} model_config;

typedef struct model_acts {
    float *encoded;                                     /* [BT,C] */
    float *ln1, *ln1_mean, *ln1_rstd;                   /* [L,BT,C], [L,BT] */
    float *qkv;                                         /* [L,BT,3C] */
    float *atty;                                        /* [L,BT,C] */
    float *lse;                                         /* [L,B,NH,T] attention rows' log-sum-exp */
    float *attproj, *resid2;                            /* [L,BT,C] */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;                              /* [L,BT,4C] */
    float *fcproj, *resid3;                             /* [L,BT,C] */
    float *lnf, *lnf_mean, *lnf_rstd;                   /* [BT,C], [BT] */
    float *logits;                                      /* [BT,Vp] */
    float *losses;                                      /* [BT] */
    /* backward scratch, one layer at a time */
    float *dresid, *dln, *datty, *dqkv, *dbig1, *dbig2;
    float *att_scratch;                                 /* KERN_ATT_SCRATCH(T, NH): fwd and bwd */
    /* inputs */
    int *tokens, *targets;
    float *weights;
} model_acts;

typedef struct model_gpt2 {
    model_config cfg;
    kern_device *dev;
    int B, T;                          /* activations are sized for B x T (B = 0: none) */
    int recompute;                     /* activation recomputation on */
    size_t tensor_size[MODEL_NTENSORS];
    size_t tensor_off[MODEL_NTENSORS];
    size_t nparams;
    float *params, *grads, *adam_m, *adam_v;
    void *act_mem;
    size_t act_bytes;
    model_acts a;
    int adam_t;                        /* AdamW steps taken */
} model_gpt2;

/* Config from the spec's model object (seeded init). */
int model_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err);
/* Config from an llm.c checkpoint header, checked against the spec. */
int model_config_from_file(const char *path, const spec_model *sm, model_config *cfg,
                           acc_err *err);
/* The same from an open file (read from its start through a dup; fd stays
 * open), e.g. one safepath.h checked; `path` names it in messages. */
int model_config_from_fd(int fd, const char *path, const spec_model *sm, model_config *cfg,
                         acc_err *err);

/* Parameters in a config (the layout's total). */
size_t model_num_params(const model_config *cfg);
/* Device bytes of parameters, gradients and AdamW moments (any micro batch). */
uint64_t model_state_bytes(const model_config *cfg);
/* Device bytes of the activations for B x T tokens (0 when B = 0). */
uint64_t model_act_bytes(const model_config *cfg, int B, int T, int recompute);
/* State + activations: a rank's whole device footprint, which is its peak
 * (nothing else is allocated while training). For planning and messages. */
uint64_t model_device_bytes(const model_config *cfg, int B, int T, int recompute);

/* Allocate the state, then activations for B x T (stored mode) when B > 0;
 * B = 0 leaves them to model_acts_alloc. */
int model_create(kern_device *dev, const model_config *cfg, int B, int T, model_gpt2 **out,
                 acc_err *err);
void model_free(model_gpt2 *m);
/* (Re)allocate the activations for B sequences, in recompute mode or not;
 * the old ones are freed first. ACC_EOOM from the device leaves the model
 * without activations (m->B = 0) but with its state intact. */
int model_acts_alloc(model_gpt2 *m, int B, int recompute, acc_err *err);
void model_acts_free(model_gpt2 *m);

/* GPT-2 init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1, padded wte rows 0. */
int model_init_seed(model_gpt2 *m, uint64_t seed, acc_err *err);
/* Parameters from an llm.c .bin (config must match model_config_from_file). */
int model_load_llmc(model_gpt2 *m, const char *path, acc_err *err);
int model_load_llmc_fd(model_gpt2 *m, int fd, const char *path, acc_err *err);
/* Write the parameters as an llm.c .bin (atomically: temp, fsync, rename). */
int model_save_llmc(const model_gpt2 *m, const char *path, acc_err *err);

/* Forward over `nseq` <= B sequences of T tokens. tokens/targets/weights
 * are host arrays of nseq*T. Returns sum(weight * token loss) in *loss_sum.
 * want_grad: keep dloss/dlogits for model_backward. */
void model_forward(model_gpt2 *m, const int *tokens, const int *targets, const float *weights,
                   int nseq, int want_grad, double *loss_sum);
/* Add this micro-batch's gradients to m->grads. */
void model_backward(model_gpt2 *m, int nseq);

/* model_backward that reports its progress, for a reduction overlapping it:
 * done(ctx, l) is called once the gradients of layers l..L-1 (and of the
 * final LayerNorm) are complete for this micro-batch, for l = L-1 down to 0,
 * then done(ctx, -1) once every gradient is (the embeddings come last: wte
 * gets gradient both first, from the logits, and last). */
typedef void (*model_grads_done_fn)(void *ctx, int layer);
void model_backward_notify(model_gpt2 *m, int nseq, model_grads_done_fn done, void *ctx);

/* Parameters (= gradient floats) of one transformer block. */
size_t model_block_params(const model_config *cfg);
/* The gradient buffer's spans for layers [lo, hi) (one per block tensor,
 * none when lo == hi) and, with `ends`, the rest of the buffer: wte + wpe
 * at its start, the final LayerNorm + MODEL_GRAD_EXTRA slots at its end.
 * Writes at most MODEL_MAX_GRAD_SPANS; returns how many. Buckets that
 * together cover [0, L) once and the ends once cover the buffer exactly. */
#define MODEL_MAX_GRAD_SPANS (MODEL_NTENSORS - 4 + 2)
int model_grad_spans(const model_gpt2 *m, int lo, int hi, int ends, kern_span *out);

void model_zero_grad(model_gpt2 *m);
/* Sum of squares of the parameter gradients (not the extra slots). */
double model_grad_sumsq(model_gpt2 *m);
/* One AdamW step on all tensors; decay only on the matrices (wte, wpe,
 * qkvw, attprojw, fcw, fcprojw), not on biases or LayerNorm weights. */
void model_adamw(model_gpt2 *m, float lr, const spec_optim *o, float grad_scale);

/* Whether tensor i gets weight decay. */
int model_tensor_decays(int i);

#endif
