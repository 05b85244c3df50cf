/* generate: text generation from a loaded model (issue 24's engine half).
 *
 * A gen_ctx is made from a model handle already loaded on a device (model.h;
 * its LoRA adapters, when the config has them, are applied on the fly by the
 * shared linear block, never merged) and an optional tokenizer (tok.h: for
 * the text pieces handed to the callback and for stop strings). It owns the
 * key/value cache: per block [positions, n_kv_head * head_dim] keys and as
 * many values, in the model's storage dtype: fp32, or bf16 for a model
 * whose weights are 16-bit (config.json's torch_dtype bfloat16 or float16;
 * keys and values rounded to nearest bf16 as they are stored, widened to
 * fp32 one block at a time where attention reads them; the model computes
 * in fp32), allocated through the device budget (ACC_EOOM, never an abort),
 * plus one chunk of inference scratch.
 *
 * gen_run: the prompt is run through the model in chunks (prefill), filling
 * the cache; then one token at a time (decode) each new token attends to
 * the cached keys / values of every earlier position (grouped-query: query
 * head h reads key/value head h / (n_head / n_kv_head)). With
 * gen_params.no_cache the same tokens come from a full forward over the
 * whole sequence for every new token instead (slower; the reference the
 * cache is tested against).
 *
 * Choosing a token, from the logits of the last position, over the real
 * vocabulary (padded rows never chosen):
 *   1. repetition_penalty p != 1: every id already in prompt or output has
 *      its logit divided by p when positive, multiplied by p otherwise;
 *   2. temperature 0: argmax (ties: the lowest id) -- greedy; the rest is
 *      skipped;
 *   3. logits / temperature; top_k > 0 keeps the k largest; top_p < 1
 *      keeps the smallest set of the largest whose probability sum reaches
 *      top_p (at least one);
 *   4. one uniform draw u in [0, 1) from a counter-based generator (the
 *      seed and the step number hashed; no state carried between steps),
 *      the token whose cumulative probability first passes u. So the same
 *      seed gives the same tokens on every run and on any thread count.
 *
 * Stopping: after max_new_tokens tokens; at an id of `eos` (the token is not
 * part of the text); when the decoded text contains a stop string (the text
 * is cut before it); when the callback returns nonzero; when the positions
 * (the model's max_seq_len, or the ctx's smaller limit) are used up.
 *
 * Threads: a ctx is used by one thread at a time (the model's rule).
 */
#ifndef ACC_GENERATE_H
#define ACC_GENERATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "model.h"
#include "tok.h"

#define GEN_MAX_STOP 16          /* stop strings a request may name */
#define GEN_MAX_STOP_LEN 256     /* bytes of one */
#define GEN_MAX_EOS 16           /* end-of-sequence ids */
#define GEN_MAX_NEW_TOKENS 65536 /* the largest max_new_tokens */

typedef struct gen_params {
    int max_new_tokens;       /* [1, GEN_MAX_NEW_TOKENS] */
    float temperature;        /* [0, 100]; 0: greedy */
    int top_k;                /* >= 0; 0: off */
    float top_p;              /* (0, 1]; 1: off */
    float repetition_penalty; /* (0, 100]; 1: off */
    uint64_t seed;
    const char *const *stop;  /* n_stop strings, each 1..GEN_MAX_STOP_LEN bytes */
    int n_stop;
    const int32_t *eos;       /* n_eos ids that end the generation */
    int n_eos;
    int no_cache;             /* 1: a full forward per token (the reference) */
} gen_params;

typedef enum gen_stop {
    GEN_STOP_LENGTH = 0,  /* max_new_tokens reached */
    GEN_STOP_EOS,         /* an eos id was sampled */
    GEN_STOP_STRING,      /* a stop string appeared */
    GEN_STOP_CALLBACK,    /* the callback asked to stop */
    GEN_STOP_POSITIONS,   /* no position left */
} gen_stop;

/* "length", "eos", "stop", "callback", "positions". */
const char *gen_stop_name(gen_stop s);

typedef struct gen_result {
    int32_t *tokens;      /* the generated ids (malloc'd; an eos id not included) */
    int n_tokens;
    char *text;           /* their text, cut before a stop string (malloc'd, NUL-ended;
                           * NULL without a tokenizer) */
    size_t text_len;
    gen_stop reason;
    int n_prompt;
    double prefill_s, decode_s; /* wall seconds of each phase */
} gen_result;

/* Called once per generated token: its id and the text it adds (may be
 * empty while a multi-byte character is incomplete or the text may begin a
 * stop string; NULL, 0 without a tokenizer); then, when text held back for
 * a stop string that never came remains at the end, once more with id -1
 * and that text. The pieces together are gen_result.text. Nonzero: stop
 * (GEN_STOP_CALLBACK). */
typedef int (*gen_token_fn)(void *ctx, int32_t id, const char *piece, size_t len);

typedef struct gen_ctx gen_ctx;

/* A context on the loaded model m (kept, not owned) with tokenizer tok (may
 * be NULL), for sequences of at most max_positions tokens (0 or more than
 * the model's max_seq_len: max_seq_len). Allocates the cache and the
 * scratch on m's device: ACC_EOOM past the budget; ACC_EINVAL when the
 * family has no inference path, ACC_EDEVICE when the device lacks an op. */
int gen_ctx_new(model *m, const tok_tokenizer *tok, int max_positions, gen_ctx **out,
                acc_err *err);
void gen_ctx_free(gen_ctx *c);
/* The positions the ctx holds (prompt + new tokens). */
int gen_ctx_positions(const gen_ctx *c);

/* Device bytes gen_ctx_new allocates for cfg and `positions` (the cache and
 * the scratch; the planner adds them to the model's). ACC_EINVAL naming
 * "max_new_tokens" on overflow. */
int gen_ctx_bytes(const model_config *cfg, int positions, uint64_t *bytes, acc_err *err);

/* The key/value cache alone within gen_ctx_bytes: n_layer x 2 (keys and
 * values) x n_kv_head x head_dim x positions x the cache's bytes per value
 * (4, or 2 for a 16-bit model); saturated (ACC_SIZE_OVERFLOW). */
uint64_t gen_kv_bytes(const model_config *cfg, int positions);
/* Those bytes per value: 4 (fp32), or 2 (bf16) for a 16-bit model. */
int gen_kv_value_bytes(const model_config *cfg);

/* Defaults: max_new_tokens 128, temperature 0 (greedy), top_k 0, top_p 1,
 * repetition_penalty 1, seed 0, no stop strings, no eos. */
void gen_params_default(gen_params *p);
/* Range checks; ACC_EINVAL naming the field ("temperature", "top_p", ...). */
int gen_params_check(const gen_params *p, acc_err *err);

/* Generate after prompt[0..n_prompt) (n_prompt >= 1, ids < vocab_size; a
 * prompt that leaves no position is ACC_EINVAL naming "prompt"). cb may be
 * NULL. *out is filled (free with gen_result_free) on success. */
int gen_run(gen_ctx *c, const int32_t *prompt, int n_prompt, const gen_params *p,
            gen_token_fn cb, void *cb_ctx, gen_result *out, acc_err *err);
void gen_result_free(gen_result *r);

/* ---- prompts */

/* The ids of a plain prompt (tokenizer's special tokens added, as
 * Hugging Face's encode does) into *out (appended). */
int gen_encode_text(const tok_tokenizer *tok, const char *text, size_t len, tok_ids *out,
                    acc_err *err);
/* The ids of a conversation (a JSON array of {role, content}) rendered with
 * `template_spec` ("auto": the tokenizer's chat template, or a template
 * name chat.h ships) with add_generation_prompt = true, special tokens not
 * added again. Errors name `field`. */
int gen_encode_chat(const tok_tokenizer *tok, const char *template_spec, json_t *messages,
                    const char *field, tok_ids *out, acc_err *err);

/* The eos ids of a model directory: generation_config.json's eos_token_id
 * (an int or a list), else config.json's; *n = 0 when neither has one.
 * Read under `roots` (safepath.h; NULL or "": none). At most `cap` ids. */
int gen_eos_from_dir(const char *roots, const char *dir, int32_t *ids, int cap, int *n,
                     acc_err *err);

/* ---- LoRA adapter directories (PEFT's: a LoRA job's export or checkpoint) */

/* cfg's LoRA from DIR/adapter_config.json (r, lora_alpha,
 * target_modules), read under `roots` (NULL or "": none): build the model
 * from the base's config with it, load the base, then gen_lora_load. */
int gen_lora_config(const char *roots, const char *dir, model_config *cfg, acc_err *err);
/* DIR/adapter_model.safetensors' adapters (PEFT's names, the layout's
 * shapes, F32 / BF16 / F16) into m's adapter tensors. Errors name "model". */
int gen_lora_load(model *m, const char *roots, const char *dir, acc_err *err);

#endif
