/* train_samples: the spec's eval_prompts answered while a job trains
 * (issue 24).
 *
 * At each evaluation (the eval_interval schedule, with or without a
 * validation set) rank 0 generates an answer to every prompt with the
 * weights of that step: each prompt (a string, tokenized with the special
 * tokens the tokenizer adds) or conversation (rendered with data.chat_template,
 * default "auto", and the generation prompt) is answered with up to
 * TSAMP_MAX_NEW tokens, temperature TSAMP_TEMPERATURE, top_p TSAMP_TOP_P and
 * the fixed seed `index` (the same at every evaluation, so the answers
 * change with the weights only), ending at the model directory's eos ids
 * (generation_config.json) or the tokenizer's eos token. Each answer is a
 * callback (the trainer's "sample" event).
 *
 * The tokenizer is data.tokenizer, else model.from, read under the job's
 * data roots once (tsamp_new). The key/value cache is allocated through
 * the device budget for each evaluation and freed after it: a device
 * without room for it skips the samples with a message (tsamp_run returns
 * ACC_EOOM), never failing the job.
 */
#ifndef ACC_TRAIN_SAMPLES_H
#define ACC_TRAIN_SAMPLES_H

#include "err.h"
#include "train_cfg.h"
#include "model.h"

#define TSAMP_MAX_NEW 64
#define TSAMP_TEMPERATURE 0.7f
#define TSAMP_TOP_P 0.9f

typedef struct tsamp tsamp;

/* The prompts of spec->eval_prompts encoded; *out NULL when there are none.
 * Errors (a tokenizer that does not load, a template, a prompt longer than
 * the model's positions) name "eval_prompts" or the tokenizer's field. */
int tsamp_new(const train_cfg *spec, const model_config *cfg, tsamp **out, acc_err *err);
void tsamp_free(tsamp *ts);

typedef void (*tsamp_fn)(void *ctx, int index, const char *prompt, const char *text);

/* Answer every prompt with m's weights now, fn once each in order. */
int tsamp_run(tsamp *ts, model *m, tsamp_fn fn, void *ctx, acc_err *err);

#endif
