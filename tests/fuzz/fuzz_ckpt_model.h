/* fuzz_ckpt_model: the tiny GPT-2 the checkpoint fuzz target loads into,
 * shared with make_seeds.c so the seed checkpoints match its shape. */
#ifndef ACC_FUZZ_CKPT_MODEL_H
#define ACC_FUZZ_CKPT_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "adamw.h"
#include "kern_device.h"
#include "model.h"

/* The model and its optimizer (the whole buffer's moments). */
static inline model *fuzz_ckpt_model(adamw **opt)
{
    kern_device_info info = {.kind = KERN_DEV_CPU, .index = 0, .mem_total = 0};
    snprintf(info.name, sizeof info.name, "cpu0");
    kern_device *dev = NULL;
    model *m = NULL;
    acc_err err = {0};
    model_config cfg = {.max_seq_len = 8, .vocab_size = 20, .padded_vocab_size = 24, .n_layer = 1, .n_head = 2,
                        .channels = 8};
    if (kern_device_open(&info, 1, &dev, &err) != 0 || model_create(dev, &cfg, 1, 8, &m, &err) != 0 ||
        model_init_seed(m, 7, &err) != 0 || adamw_create(dev, 0, m->nparams, opt, &err) != 0) {
        fprintf(stderr, "fuzz_ckpt: cannot make the model: %s\n", err.msg);
        abort();
    }
    return m;
}

#endif
