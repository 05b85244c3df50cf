/* model: model families behind one table, and the generic model handle.
 *
 * A family (GPT-2, LLaMA, ...) is a const model_family table, in the style
 * of ggml-backend-impl.h: REQUIRED entries every family fills, OPTIONAL ones
 * that may be NULL (the generic code then uses the default stated at the
 * entry, or refuses the operation with a clear error). Everything outside
 * core/model/ -- trainer, planner, checkpoints, spec validation -- talks to
 * a model through the functions below, never to a family's own header, so
 * adding a family is one file (core/model/model_<family>.c), one line in the
 * registry (model.c) and one in core/model/meson.build.
 *
 * Config. model_config is one struct for every family; a field a family does
 * not use is ignored, and 0 means "the family's default" wherever a default
 * is stated, so a designated initializer naming only GPT-2's fields is a
 * valid GPT-2 config. It comes from the spec's "model" object
 * (model_config_from_spec), from a native checkpoint file named by
 * "model.init_from" (model_config_from_fd: llm.c .bin, safetensors; the
 * daemon opens it under the data roots by descriptor, safepath.h, and the
 * families read only that descriptor), or
 * from a Hugging Face config.json (model_config_from_hf, by "model_type").
 *
 * Layout. The parameters are ONE flat float buffer; the family describes it
 * as a list of named tensors (model_tensor): Hugging Face name, Hugging Face
 * shape, offset and count in the buffer, layer (-1: not in a block), and the
 * optimizer's flags (decays, trains). The gradient buffer has the same
 * layout followed by `grad_tail` floats the CALLER owns (the trainer keeps
 * its step slots there so they ride the one all-reduce): the model zeroes
 * and reduces them with the rest but never reads or writes them otherwise.
 * Checkpoints, Hugging Face output, the optimizer and the bucketed gradient
 * reduction all walk the layout; none knows a family's tensors.
 *
 * The weight store. model.c owns the parameters' device storage; every
 * family reads a weight through model_weight and nothing else. Each
 * tensor has a storage dtype (model_tensor.dtype): ST_F32 tensors live in
 * `params` at their layout offset; the others (today BF16 / F16: a LoRA
 * base loaded from a 16-bit model.from, model_base_dtype; room for a
 * 4-bit one) live in `wstore` at the tensor's `soff` bytes, in the dtype
 * they were loaded in, never written after the load. Only a frozen suffix
 * of the layout may be stored narrower, so `params` is the fp32 prefix
 * [0, nf32). model_weight widens such a tensor into a shared fp32 scratch
 * (`wfetch`: one slot the size of the largest narrow tensor, one the size
 * of the largest 1-D one, for a bias used beside its matrix) right before
 * the op that uses it; frozen weights need no gradient, only W for dx.
 * Host copies (model_params_download / upload, model_weights_*) stay
 * fp32: widened exactly, narrowed by rounding to nearest even (exact for
 * weights loaded in that dtype). Forward and backward bracket each block
 * with model_layer_begin / model_layer_end (blocks.h's layer loop): where
 * the ZeRO-3 store (model_shard.h, m->shard) gathers a block's parameters
 * and releases them, and an offloaded one would stream them in (no-ops
 * for a whole model). At ZeRO-3, params / grads hold the rank's partition
 * only: model_weight and model_grad resolve into the gathered slots.
 *
 * Bytes. model_state_bytes and model_act_bytes are the device bytes the
 * model allocates (parameters + gradients + tail; activations for B x T),
 * overflow-checked: a size past 2^64 is ACC_EINVAL naming the spec field,
 * never a wrapped small number (checked.h). Nothing else is allocated by
 * the model, so they are exact.
 *
 * Handle. model_create allocates parameters and gradients (zeroed) through
 * the device's budget, and activations for B x T when B > 0; the
 * activations can be freed and re-allocated for another micro batch or
 * recompute mode (model_acts_alloc) keeping the weights, so a job adapts to
 * an out-of-memory mid-run. A model is used by one thread (its rank's).
 *
 * Forward / backward. model_forward(want_grad = 1) leaves what the backward
 * needs in the activations (per-token weights carry the loss normalisation);
 * model_backward ADDS this micro-batch's gradients to grads (+=), so
 * micro-steps accumulate in place. model_backward_notify reports, through
 * `done(ctx, l)`, when the gradients of layers l..L-1 (and of every
 * non-block tensor the backward has finished with, e.g. a final norm) are
 * complete, for l = L-1 down to 0, then done(ctx, -1) once every gradient
 * is; the bucketed reduction starts a bucket as soon as its spans are
 * complete (model_grad_spans).
 */
#ifndef ACC_MODEL_H
#define ACC_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "model_cfg.h"
#include "kern_device.h"
#include "kern_span.h"
#include "safetensors.h"

typedef struct model_family model_family;
typedef struct model model;
struct blk_infer; /* blocks.h: the inference cache and scratch (generate.h) */

/* ---- config */

typedef enum model_rope_scaling {
    MODEL_ROPE_NONE = 0,   /* plain rotary embedding */
    MODEL_ROPE_LINEAR,     /* positions divided by rope_factor */
    MODEL_ROPE_LLAMA3,     /* LLaMA-3 frequency-dependent scaling */
} model_rope_scaling;

#define MODEL_TYPE_MAX 32
#define MODEL_LORA_MAX_TARGETS 16
#define MODEL_LORA_NAME_MAX 32
#define MODEL_MAX_SLIDING 256 /* layers whose sliding window a config can mark */

/* LoRA (model_lora.h): adapters on the named projections; r = 0: none. */
typedef struct model_lora_cfg {
    int r;
    double alpha;          /* the update is scaled by alpha / r */
    bool merge;            /* outputs also hold the merged model (save.merge_lora) */
    int n_targets;         /* resolved module names ("all-linear" expanded) */
    char targets[MODEL_LORA_MAX_TARGETS][MODEL_LORA_NAME_MAX];
} model_lora_cfg;

typedef struct model_config {
    /* the family; NULL: the default family (model_family_default, "gpt2") */
    const model_family *family;
    /* Hugging Face "model_type" this config came from or is written as
     * ("gpt2", "llama", "mistral", "qwen2"); "": the family's name */
    char model_type[MODEL_TYPE_MAX];
    int n_layer;
    int n_head;
    int n_kv_head;          /* key/value heads (grouped-query attention); 0: n_head */
    int channels;           /* hidden size (n_embd, hidden_size) */
    int head_dim;           /* 0: channels / n_head */
    int intermediate_size;  /* MLP width; 0: the family's default (GPT-2: 4 channels) */
    int vocab_size;         /* real vocabulary (tokens the data may hold) */
    int padded_vocab_size;  /* rows of the embedding / lm_head, >= vocab_size; 0: vocab_size */
    int max_seq_len;        /* positions (GPT-2: rows of wpe; LLaMA: max_position_embeddings) */
    double norm_eps;        /* LayerNorm / RMSNorm epsilon; 0: the family's default */
    double rope_theta;      /* rotary base; 0: the family's default (10000) */
    model_rope_scaling rope_scaling;
    double rope_factor;            /* linear / llama3: factor */
    double rope_low_freq_factor;   /* llama3 */
    double rope_high_freq_factor;  /* llama3 */
    int rope_original_max_pos;     /* llama3: original_max_position_embeddings */
    bool tie_word_embeddings;      /* lm_head is the token embedding (GPT-2: always) */
    bool attention_bias;           /* q/k/v projections have biases (Qwen2; GPT-2: always) */
    bool attention_out_bias;       /* the output projection has one (LLaMA's attention_bias;
                                    * GPT-2: always; Qwen2: never) */
    bool mlp_bias;                 /* MLP projections have biases (GPT-2: always) */
    model_lora_cfg lora;           /* LoRA adapters (r = 0: every weight trains) */
    /* The dtype model.from's weights are stored in (config.json's
     * torch_dtype; ST_F32 without one, and for every other source). Under
     * LoRA a BF16 or F16 one keeps the frozen base in it on the device
     * (the weight store: model_base_dtype); otherwise it changes nothing. */
    st_dtype weights_dtype;
    /* Gemma 2's attention and logits (decoder.h; 0: off). */
    double query_pre_attn_scalar;   /* scores * this^-1/2 (0: head_dim^-1/2) */
    double attn_logit_softcapping;  /* scores -> cap * tanh(scores / cap) */
    double final_logit_softcapping; /* logits likewise */
    int sliding_window;             /* keys a sliding layer's query sees, itself included */
    uint64_t sliding_layers[MODEL_MAX_SLIDING / 64]; /* bit l: layer l slides */
    /* Lean activations (the spec's lean_activations):
     * attention through the backend's attention_lean_fwd / _bwd (scratch
     * KERN_ATT_LEAN_SCRATCH, no T x T buffer) and the LM head + loss in
     * chunks of lean_chunk rows (blocks.h); model_logits is then NULL.
     * fp32 results within summation order of the default. */
    bool lean_acts;
    int lean_chunk; /* rows per LM-head chunk with lean_acts (0: BLK_HEAD_CHUNK) */
    /* QLoRA: MODEL_QUANT_NF4 keeps every frozen linear
     * weight of the decoder (model_tensor_nf4) in NF4 (nf4.h) in the
     * weight store; the rest of the frozen base stays in weights_dtype. */
    int quant;                /* MODEL_QUANT_NONE, MODEL_QUANT_NF4 */
    bool quant_nested;        /* double quantization (bnb_4bit_use_double_quant) */
    bool quant_in_files;      /* model.from holds them 4-bit (transformers' layout, config.json's
                               * quantization_config); false: quantized at load (model.quantize) */
    /* bf16 activation storage (the spec's precision "bf16"): what a block
     * keeps between its forward and its backward is stored in bf16, one
     * block computes in fp32 at a time (blocks.h "bf16 activation
     * storage"); false: every activation fp32, as it always was. */
    bool act_bf16;
    /* bf16 working weights at ZeRO stage 3 (the spec's precision "bf16"
     * with zero_optimization.stage 3; model_shard.h "bf16 working
     * weights"): each block's 2-D tensors (its linear layers' matrices,
     * only ever matmul operands) are gathered in bf16 and widened for the
     * op; the partition (the fp32 master), the gradients, the 1-D tensors
     * and the ends stay fp32. Only with the device's bf16 precision
     * (set_precision 1), which rounds those operands anyway: no bit
     * changes. Ignored by a whole (unsharded) model; false: fp32 as always. */
    bool weights_bf16;
    /* With weights_bf16, the device partition's matrix part in bf16 too
     * (the spec's offload_optimizer without offload_param: the fp32 master
     * is the optimizer's, in host memory; model_shard.h "bf16 partition").
     * The trainer then hands the store that master (model_shard_set_master)
     * before any weight is written; false: the partition is fp32. */
    bool partition_bf16;
    /* ZeRO stage 3's gradient partition in host memory while the
     * parameters stay on the device (the spec's offload_optimizer without
     * offload_param: the optimizer's gradients are that partition;
     * model_shard.h "offload_optimizer"). A sharded model is then created
     * with model_opts.host_grads; ignored by a whole model. */
    bool grads_host;
    /* Activations in recompute mode (the trainer's recomputation), both
     * off by default (the spec's lean_activations and
     * activation_checkpointing.offload set them; docs/engine.md):
     * lean_tokens, with lean_acts: a decoder block's per-token parts (norms,
     * projections, MLP, residuals) run in chunks of blk_head_chunk tokens,
     * only attention's q, k, v, output and lse are kept for the whole
     * sequence (fp32 results within summation order of the unchunked path);
     * act_offload: each block's input (the checkpoint the recomputation
     * starts from) lives in host memory (model.host), copied out after the
     * block's forward and back into one of two device slots before its
     * recomputation (bit-identical results). */
    bool lean_tokens;
    bool act_offload;
} model_config;

#define MODEL_QUANT_NONE 0
#define MODEL_QUANT_NF4 1

/* ---- layout */

#define MODEL_NAME_MAX 96
#define MODEL_MAX_DIMS 4
/* Most spans model_grad_spans writes (one reduction group). */
#define MODEL_MAX_GRAD_SPANS KERN_COMM_MAX_SPANS

/* One named tensor of the flat parameter buffer. */
typedef struct model_tensor {
    char name[MODEL_NAME_MAX];  /* Hugging Face name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;
    int64_t shape[MODEL_MAX_DIMS]; /* Hugging Face shape (as stored in its files) */
    size_t offset;              /* floats into params (and grads) */
    size_t count;               /* floats it occupies in the buffer: prod(shape), or
                                 * more when the buffer pads it (padded vocabulary rows,
                                 * kept zero, never in a file) */
    int layer;                  /* transformer block, or -1 (embeddings, final norm) */
    bool decays;                /* AdamW weight decay applies */
    bool trains;                /* the optimizer updates it (false: frozen) */
    bool transposed;            /* 2-D, stored [shape[0], shape[1]] in files but
                                 * [shape[1], shape[0]] in the buffer (GPT-2 Conv1D) */
    bool adapter;               /* a LoRA adapter (PEFT's name), not in the base model's files */
    st_dtype dtype;             /* its storage dtype on the device (the weight store) */
    size_t soff;                /* non-F32: its first byte in the model's wstore */
    bool stored;                /* in the wstore at soff (any dtype, F32 included) */
    float nf4_offset;           /* ST_NF4 with double quantization: the absmax
                                 * values' offset (nf4.h), set when its bytes are stored */
} model_tensor;

typedef struct model_layout {
    model_tensor *t;            /* ascending offset, contiguous, no overlap */
    int n;
    size_t nparams;             /* floats of the buffer (sum of counts) */
    size_t ntrain;              /* floats [0, ntrain) train and have gradients; the rest
                                 * is frozen (LoRA's base weights): nparams without LoRA */
} model_layout;

/* ---- the family table */

/* The Hugging Face names a family reads: one row per architecture, with
 * the model_type that goes with it and what that type implies (flags). */
#define MODEL_HF_QKV_BIAS 1u /* q/k/v biases always, no output bias (Qwen2) */
typedef struct model_hf_name {
    const char *architecture; /* config.json "architectures"[0], e.g. "Qwen2ForCausalLM" */
    const char *model_type;   /* "qwen2" */
    unsigned flags;           /* MODEL_HF_* */
} model_hf_name;

struct model_family {
    const char *name;                 /* the spec's "model.arch" ("gpt2", "llama") */
    const model_hf_name *hf_names;    /* what it reads from Hugging Face (the first row is
                                       * what it writes by default); ended by a zero row */
    const char *const *lora_default_targets; /* PEFT's default target modules for it
                                       * (NULL-ended); NULL: lora.target_modules required */

    /* REQUIRED: config from the spec's model object (shape keys, no file);
     * checks it (model_config_check semantics), errors name "model.<key>". */
    int (*config_from_spec)(const spec_model *sm, model_config *cfg, acc_err *err);
    /* REQUIRED: is this a config the family can build? (shape >= 1,
     * divisibility, vocab <= padded vocab, ...); errors name "model.<key>". */
    int (*config_check)(const model_config *cfg, acc_err *err);
    /* REQUIRED: the parameter layout of `cfg` (allocates out->t; free with
     * model_layout_free). ACC_EINVAL naming the field when a size overflows. */
    int (*layout)(const model_config *cfg, model_layout *out, acc_err *err);
    /* REQUIRED: device bytes of the activations for B x T tokens (B >= 1) in
     * recompute mode or not: exactly what acts_alloc allocates. Overflow:
     * ACC_EINVAL naming the field. */
    int (*act_bytes)(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                     acc_err *err);
    /* REQUIRED: allocate the activations for m->B x m->T in m->recompute mode
     * (m->B, m->T, m->recompute and m->act_bytes = act_bytes(...) are set by
     * the caller, model_acts_alloc) and keep them in the family's state;
     * ACC_EOOM from the device leaves nothing allocated. */
    int (*acts_alloc)(model *m, acc_err *err);
    /* REQUIRED: free them (no-op when none; also called with m->impl NULL,
     * before create or after a failed one). */
    void (*acts_free)(model *m);
    /* REQUIRED: forward over nseq <= m->B sequences of m->T tokens; host
     * arrays tokens/targets/weights of nseq*T; *loss_sum = sum(weight * token
     * loss) (double). want_grad: keep what backward needs. */
    void (*forward)(model *m, const int *tokens, const int *targets, const float *weights,
                    int nseq, int want_grad, double *loss_sum);
    /* REQUIRED: add the micro-batch's gradients to m->grads; done may be NULL
     * (see model_backward_notify above for its contract). */
    void (*backward)(model *m, int nseq, void (*done)(void *ctx, int layer), void *ctx);
    /* REQUIRED: the family's seeded initialisation into host params[nparams]
     * (all zero on entry; padded rows stay zero). Deterministic in seed. */
    int (*init_host)(const model *m, uint64_t seed, float *params, acc_err *err);

    /* OPTIONAL: device bytes of parameters + gradients (tail excluded);
     * NULL: 2 * nparams * sizeof(float). */
    int (*param_bytes)(const model_config *cfg, uint64_t *bytes, acc_err *err);
    /* OPTIONAL: the family's state beside the handle (allocated at create,
     * freed at free); NULL: none (m->impl stays NULL until acts_alloc). */
    int (*create)(model *m, acc_err *err);
    void (*destroy)(model *m);
    /* OPTIONAL: config from a Hugging Face config.json (already parsed; the
     * caller names the file in errors: field "model.from"). NULL: the family
     * reads no Hugging Face directories. */
    int (*config_from_hf)(const json_t *hf, model_config *cfg, acc_err *err);
    /* OPTIONAL: write the family's keys of cfg into a config.json object
     * (the caller keeps the input's other keys). NULL: cannot write one. */
    int (*config_to_hf)(const model_config *cfg, json_t *hf, acc_err *err);
    /* OPTIONAL: config from a native checkpoint file named by init_from,
     * already open as `fd` (a regular file the caller opened, under the
     * data roots for a job: safepath.h; read it from its start through a
     * dup or pread, leave fd open, never reopen `path` by name). `path` is
     * only for messages, which never echo the file's bytes. Checked against
     * the spec; errors name "model.init_from". NULL: init_from is refused
     * for this family. */
    int (*config_from_fd)(int fd, const char *path, const spec_model *sm, model_config *cfg,
                          acc_err *err);
    /* OPTIONAL: weights from that open file into host params[nparams]
     * (same fd rules). NULL: model_load_fd refuses. */
    int (*load_fd_host)(const model *m, int fd, const char *path, float *params, acc_err *err);
    /* OPTIONAL: the device logits [nseq * T, padded_vocab_size] of the last
     * forward with want_grad = 0 (for tests and tools). NULL: none. */
    const float *(*logits)(const model *m);
    /* OPTIONAL: the device per-token losses [nseq * T] (-log p(target)) of
     * the last forward. NULL: none. */
    const float *(*token_losses)(const model *m);
    /* OPTIONAL: true when the forward honours model.positions (packed
     * documents: data.packing); false refuses packing at submit. */
    bool packing;
    /* OPTIONAL: true when the family honours model_config.lean_tokens (its
     * linear layers then run on at most blk_head_chunk rows in recompute
     * mode: model_linear_rows); false: lean_tokens changes nothing. */
    bool token_chunks;
    /* OPTIONAL (generate.h): run n <= s->chunk tokens (host ids) at
     * positions p0 .. p0+n-1 with the key/value cache `s` (blocks.h's
     * blk_infer: its contract), the last row's logits into s->logits.
     * NULL: the family cannot generate. */
    void (*infer)(model *m, struct blk_infer *s, const int *tokens, int n, int p0);
};

/* ---- registry */

/* The family of a spec's "model.arch" ("" or NULL: the default, gpt2);
 * NULL when unknown. */
const model_family *model_family_by_arch(const char *arch);
/* The family reading Hugging Face model_type `type`; NULL when none. */
const model_family *model_family_by_hf_type(const char *type);
/* The registry row of a model_type; NULL when no family reads it. */
const model_hf_name *model_hf_name_of(const char *type);
/* The family a config.json names: "architectures" and "model_type" are
 * both checked when present and must agree; errors (ACC_EINVAL, field
 * "model.from") name `file`, the key and the registered names. */
int model_family_of_hf(const json_t *config, const char *file, const model_family **out,
                       acc_err *err);
/* The default family (gpt2). */
const model_family *model_family_default(void);
/* The family of a config (cfg->family, or the default). */
const model_family *model_family_of(const model_config *cfg);
/* The registered families' names, "gpt2, llama", into buf[n] (for error
 * messages); returns buf. */
const char *model_family_names(char *buf, size_t n);
/* The i-th registered family (i >= 0), NULL past the last. */
const model_family *model_family_at(int i);

/* ---- config */

/* Config from the spec's model object (arch through the registry; the
 * error for an unknown arch names "model.arch" and lists the families). */
int model_config_from_spec(const spec_model *sm, model_config *cfg, acc_err *err);
/* Config from the native checkpoint file open as `fd` (init_from, opened
 * by the caller under the roots, safepath.h; `path` names it in messages),
 * checked against the spec's shape keys; family from sm->arch. */
int model_config_from_fd(int fd, const char *path, const spec_model *sm, model_config *cfg,
                         acc_err *err);
/* The same by name, for tools and tests: opened with no root restriction
 * but still a regular file only, non-blocking (sp_open_file with no roots). */
int model_config_from_file(const char *path, const spec_model *sm, model_config *cfg,
                           acc_err *err);
/* Config from a parsed Hugging Face config.json: family by its
 * "model_type" (unknown: ACC_EINVAL, field "model.from"). */
int model_config_from_hf(const json_t *hf, model_config *cfg, acc_err *err);
/* Caps on a config's sizes, whatever its source (a spec, config.json, a
 * native file): checked by model_config_check before any layout is built,
 * so a hostile config.json cannot make the layout (or the planner's
 * arithmetic) grow without bound. docs/engine.md states them. */
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_HIDDEN 65536
#define MODEL_MAX_HEADS 4096
#define MODEL_MAX_HEAD_DIM 4096
#define MODEL_MAX_INTERMEDIATE (1 << 20)
#define MODEL_MAX_VOCAB (1 << 24)
#define MODEL_MAX_POSITIONS (1 << 20)
/* The caps above (ACC_EINVAL, field "model.<spec key>", the message naming
 * the config.json key too), then the family's config_check. The layout,
 * model_state_bytes and model_act_bytes call it first. */
int model_config_check(const model_config *cfg, acc_err *err);

/* The one config.json reader (for families' config_from_hf): member
 * `key` of obj. Absent or null: *out = def, or for ints with def < 0 an
 * error "config.json has no <key>". Present with the wrong type (ints:
 * outside [1, 2^31)): "config.json: <key> must be ...". Field "model.from". */
int model_hf_int(const json_t *obj, const char *key, int def, int *out, acc_err *err);
int model_hf_num(const json_t *obj, const char *key, double def, double *out, acc_err *err);
int model_hf_bool(const json_t *obj, const char *key, bool def, bool *out, acc_err *err);

/* ---- layout (generic: walks the family's layout) */

int model_layout_build(const model_config *cfg, model_layout *out, acc_err *err);
void model_layout_free(model_layout *l);
/* The tensor called `name`, or NULL. */
const model_tensor *model_layout_find(const model_layout *l, const char *name);
/* A view of l without its leading LoRA adapters: the base model's tensors
 * (same offsets into the buffer; l itself without LoRA). Not freed. */
model_layout model_layout_base(const model_layout *l);
/* Floats of block `layer`'s tensors. */
size_t model_layout_layer_floats(const model_layout *l, int layer);
/* Of them, the trainable ones (a block's share of the gradients under LoRA). */
size_t model_layout_layer_train_floats(const model_layout *l, int layer);
/* Append a tensor at the end of the buffer (for families' layout()):
 * shape of ndim dims, `count` floats in the buffer (0: prod(shape));
 * grows l->t. Overflow or host OOM: an error naming `field`. */
int model_layout_add(model_layout *l, int *cap, const char *name, int layer, int ndim,
                     const int64_t *shape, size_t count, bool decays, bool trains,
                     bool transposed, const char *field, acc_err *err);

/* The dtype a LoRA model keeps its frozen base in on the device: ST_BF16
 * or ST_F16 for a 16-bit model.from (weights_dtype), else ST_F32. */
st_dtype model_base_dtype(const model_config *cfg);

/* Whether the config keeps tensor t in NF4: cfg->quant
 * is MODEL_QUANT_NF4 and t is a linear weight of a block (2-D, named
 * "*.weight", not transposed: Conv1D layers are not quantized), not an
 * adapter. The embeddings, norms and LM head never are (as transformers). */
bool model_tensor_nf4(const model_config *cfg, const model_tensor *t);
/* How many of cfg's base tensors model_tensor_nf4 would quantize. */
int model_nf4_count(const model_config *cfg);

/* One NF4 tensor's parts as transformers saves them (host memory):
 * packed codes, the 16-value map, an fp32 absmax per block or, nested,
 * the absmax codes, nested absmax, 256-value map and offset. */
typedef struct model_nf4_parts {
    const uint8_t *codes;
    const float *map;
    const float *absmax;
    const uint8_t *qabsmax;
    const float *nested_absmax;
    const float *nested_map;
    float offset;
} model_nf4_parts;
/* Store the NF4 tensor t (model_tensor_nf4, frozen, under LoRA) of m from
 * its parts, byte for byte; ACC_EINVAL when t is not stored in NF4. */
int model_nf4_store(model *m, const model_tensor *t, const model_nf4_parts *p, acc_err *err);

/* Parameters of a config (the layout's nparams); 0 when the config is invalid. */
size_t model_num_params(const model_config *cfg);
/* Of them, the trainable ones (ntrain: the LoRA adapters, else all). */
size_t model_num_trainable(const model_config *cfg);
/* Floats of one transformer block (0 when invalid). */
size_t model_block_params(const model_config *cfg);

/* ---- bytes (overflow-checked; ACC_EINVAL naming a field on overflow) */

/* Parameters + gradients + grad_tail floats, as model_create_ex allocates
 * (a 16-bit base: its 2-byte tensors and the fetch scratch instead of fp32). */
int model_state_bytes(const model_config *cfg, size_t grad_tail, uint64_t *bytes, acc_err *err);
/* Activations for B x T (0 when B = 0). */
int model_act_bytes(const model_config *cfg, int B, int T, int recompute, uint64_t *bytes,
                    acc_err *err);
/* Activation checkpoints in host memory in this mode (cfg->act_offload and
 * recompute). */
bool model_act_offload(const model_config *cfg, int recompute);
/* Host bytes of those checkpoints for B x T: n_layer x B x T x channels
 * floats; with act_bf16 one B x T x channels of floats (the embedding's
 * output) and n_layer - 1 of bf16 values (the rounded block outputs,
 * blocks.h); 0 when not offloading (saturated). */
uint64_t model_act_host_bytes(const model_config *cfg, int B, int T, int recompute);
/* Rows the linear layers run on for n_tokens tokens in this mode: n_tokens,
 * or at most one token chunk (blk_head_chunk) when the family chunks the
 * recomputed blocks (token_chunks, lean_acts, lean_tokens, recompute). */
uint64_t model_linear_rows(const model_config *cfg, uint64_t n_tokens, int recompute);

/* ---- the handle */

struct model {
    const model_family *family;
    kern_device *dev;
    model_config cfg;
    model_layout layout;
    size_t nparams;       /* layout.nparams */
    size_t ngrad;         /* layout.ntrain: floats with a gradient (grads[0, ngrad)); the
                           * caller's tail follows at grads + ngrad */
    size_t grad_tail;     /* floats past the gradients, the caller's */
    float *params;        /* [nf32], device: the layout's fp32 tensors */
    size_t nf32;          /* floats [0, nf32) of the layout stored in fp32 (nparams, or
                           * ngrad with a 16-bit base) */
    void *wstore;         /* the narrower tensors (model_tensor.dtype, .soff), or NULL */
    float *wfetch;        /* fp32 scratch model_weight widens into (with wstore only) */
    size_t wfetch_big;    /* floats of its first slot (the largest narrow tensor) */
    float *grads;         /* [ngrad + grad_tail], device, accumulated += (frozen
                           * tensors past ngrad have none) */
    int B, T;             /* activations are sized for B x T (B = 0: none) */
    int recompute;        /* activation recomputation on */
    uint64_t act_bytes;   /* device bytes of the activations now */
    void *impl;           /* the family's state (activations, views) */
    /* Packed documents (data.packing): host [nseq*T] positions of the next
     * forward's tokens, restarting at 0 at each document, or NULL (p = t).
     * Families with model_family.packing read them (RoPE positions and
     * attention within each document, kern_device.h); the backward reuses
     * the forward's. */
    const int *positions;
    size_t wstore_bytes;  /* bytes of wstore (0 without one) */
    /* ZeRO stage 3 (model_shard.h): params and grads hold this rank's
     * partition only, the blocks are gathered into slots; NULL: whole */
    struct model_shard *shard;
    struct host_mem *shard_host; /* offload_param: where the partition lives (NULL: the device) */
    bool shard_pin;              /* and its buffers that cross the bus page-locked */
    bool shard_grads_only;       /* shard_host holds the gradient partition alone (cfg.grads_host) */
    size_t nheld;         /* floats of params and grads this rank holds: ngrad, or its partition's */
    float *gtail;         /* the caller's tail: grads + ngrad, or (ZeRO-3) past rank 0's
                           * partition, at the same offset on every rank */
    /* act_offload (model_act_offload): the job's host-memory budget the
     * checkpoints are allocated from (the caller's; required then), and
     * the checkpoints themselves, [L][B*T, C] floats, with act_bf16 one
     * [B*T, C] of floats then [L-1][B*T, C] bf16 values
     * (model_act_host_bytes) */
    struct host_mem *host;
    float *ck_host;
    size_t ck_host_bytes;
};

/* Floats past the gradients model_create reserves for its caller. */
#define MODEL_GRAD_EXTRA 16

typedef struct model_opts {
    int B, T;             /* activations for B x T now (B = 0: later) */
    size_t grad_tail;     /* floats the caller owns past the gradients */
    /* ZeRO stage 3: the parameters partitioned over `world` ranks of
     * `comm` (model_shard.h), this one `rank`; NULL: a whole model */
    struct kern_comm *comm;
    int rank, world;
    /* with comm: the partition in this host memory (offload_param,
     * model_shard_create_host); NULL: on the device */
    struct host_mem *host_params;
    bool host_params_pin; /* and page-locked where the device can (offload_param.pin_memory) */
    /* with comm and cfg.grads_host (without host_params): the gradient
     * partition in this host memory (model_shard_create_host_grads),
     * required then; pin: its staging page-locked */
    struct host_mem *host_grads;
    bool host_grads_pin;
} model_opts;

/* Allocate parameters and gradients (zeroed), then activations for B x T
 * (stored mode) when B > 0. T must be in [1, cfg->max_seq_len]. */
int model_create_ex(kern_device *dev, const model_config *cfg, const model_opts *o, model **out,
                    acc_err *err);
/* model_create_ex with grad_tail = MODEL_GRAD_EXTRA. */
int model_create(kern_device *dev, const model_config *cfg, int B, int T, model **out,
                 acc_err *err);
void model_free(model *m);
/* (Re)allocate the activations for B sequences, recompute mode or not; the
 * old ones are freed first. ACC_EOOM leaves the model without activations
 * (m->B = 0) but with its parameters and gradients intact. */
int model_acts_alloc(model *m, int B, int recompute, acc_err *err);
void model_acts_free(model *m);

/* The family's seeded init, uploaded. */
int model_init_seed(model *m, uint64_t seed, acc_err *err);
/* Weights from init_from's native file open as `fd` (family's
 * load_fd_host; `path` for messages). */
int model_load_fd(model *m, int fd, const char *path, acc_err *err);

void model_forward(model *m, const int *tokens, const int *targets, const float *weights,
                   int nseq, int want_grad, double *loss_sum);
void model_backward(model *m, int nseq);
typedef void (*model_grads_done_fn)(void *ctx, int layer);
void model_backward_notify(model *m, int nseq, model_grads_done_fn done, void *ctx);

/* The gradient buffer's spans for layers [lo, hi) (none when lo == hi)
 * and, with `ends`, every tensor outside the blocks plus the caller's tail:
 * ascending, neighbours in memory merged while the layer does not go down
 * (a layer-major layout: one span per bucket; GPT-2's tensor-major one:
 * one span per block tensor). Buckets that cover [0, L) once plus
 * the ends once cover [0, ngrad + grad_tail) exactly once (frozen tensors have no gradient). Writes at most
 * MODEL_MAX_GRAD_SPANS; returns how many (-1 if more were needed). */
int model_grad_spans(const model *m, int lo, int hi, int ends, kern_span *out);

/* The gradient of the tensor at layout offset off for the next op
 * (grads + off, or a ZeRO-3 gradient slot); NULL when frozen. */
float *model_grad(model *m, size_t off);
/* The layout AdamW walks over params / grads: the model's, or the
 * ZeRO-3 partition's (model_shard.h). */
const model_layout *model_held_layout(const model *m);
/* Before one rank reads the whole parameters to the host
 * (model_params_download: a checkpoint): at ZeRO-3 every rank calls it (a
 * collective) and the ranks with `keep` hold them until
 * model_params_release; a no-op for a whole model. */
int model_params_gather(model *m, bool keep);
void model_params_release(model *m);

void model_zero_grad(model *m);
/* Sum of squares of the parameter gradients (not the tail). */
double model_grad_sumsq(model *m);

/* The tensor called `name`, or NULL. */
const model_tensor *model_find_tensor(const model *m, const char *name);
/* The family's logits of the last forward (want_grad = 0), device memory;
 * NULL when the family does not expose them or there are no activations. */
const float *model_logits(const model *m);
/* The family's per-token losses of the last forward, device memory; NULL
 * when not exposed or there are no activations. */
const float *model_token_losses(const model *m);

/* ---- weights by layout (host side; checkpoints and Hugging Face files) */

/* Tensor t of the host buffer params as it is stored in files: prod(shape)
 * floats into out (transposed back for `transposed`, padding dropped). */
void model_tensor_to_file(const model_tensor *t, const float *params, float *out);
/* The inverse: prod(shape) floats of a file into the host buffer (padding
 * left as it is). */
void model_tensor_from_file(const model_tensor *t, const float *in, float *params);
/* Floats of a tensor in files: prod(shape). */
size_t model_tensor_file_count(const model_tensor *t);

/* Device <-> host copies of the whole parameter buffer (fp32 on the host;
 * a 16-bit base widened / narrowed). */
void model_params_download(const model *m, float *host);
void model_params_upload(model *m, const float *host);
/* The same for the floats [off, off + n) of the layout (any range). */
void model_weights_download(const model *m, float *host, size_t off, size_t n);
void model_weights_upload(model *m, const float *host, size_t off, size_t n);
/* The fp32 device weights of the tensor at layout offset `off`, for the
 * next op: params + off, or a frozen 16-bit tensor widened into scratch
 * slot `slot` (0: any tensor; 1: a 1-D one, e.g. a bias used beside a
 * slot-0 matrix), valid until the next model_weight of that slot. */
const float *model_weight(model *m, size_t off, int slot);
/* Block `layer`'s parameters are about to be used (begin) / are done
 * with (end) in the forward or the backward: the ZeRO-3 store gathers
 * (and prefetches the next block) / releases them and reduce-scatters the
 * block's gradients after its backward; no-ops for a whole model. */
void model_layer_begin(model *m, int layer, bool backward);
void model_layer_end(model *m, int layer, bool backward);

/* Every tensor of layout `l` from an open safetensors file into the host
 * buffer params[nparams] (zeroed first, so padding is 0): by name, F32, the
 * layout's shape. A missing tensor or a wrong dtype / shape is ACC_EINVAL
 * naming `field` and the file (`path`) and the tensor. */
int model_safetensors_read(const model_layout *l, const st_file *f, const char *path,
                           const char *field, float *params, acc_err *err);
/* Write the host buffer params as one safetensors file under the layout's
 * names and shapes (F32), with metadata md[nmd]; atomic (st_write). */
int model_safetensors_write(const model_layout *l, const float *params, const char *path,
                            const st_meta *md, int nmd, acc_err *err);

#endif
