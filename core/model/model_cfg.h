/* model_cfg: what the model layer reads of a training job's configuration.
 *
 * The spec's "model" and "lora" sections as the engine owns them. The jobs
 * layer (job_spec.h) parses JSON into these structs; the model layer never
 * sees a job spec (docs/architecture.md, "Layers"). The field names are the
 * spec's keys, so a message can name the key it is about.
 */
#ifndef ACC_MODEL_CFG_H
#define ACC_MODEL_CFG_H

#include <limits.h>
#include <stdbool.h>

typedef struct spec_model {
    char arch[16];         /* "gpt2" */
    int n_layer, n_head, n_embd, seq_len;
    int vocab_size;        /* tokens of the data (256 for byte-level text) */
    int padded_vocab_size; /* rows of the embedding; >= vocab_size (default = vocab_size) */
    char init_from[PATH_MAX]; /* "" or an llm.c .bin / .safetensors file */
    int n_kv_head;         /* llama: key/value heads (0 = n_head) */
    int intermediate_size; /* llama: MLP width (0 = the family's default) */
    char from[PATH_MAX];   /* "" or a Hugging Face model directory (resolved); the
                            * sizes above are then config.json's */
    /* h-dsconf: model.from as written when it named a hub repository
     * ("meta-llama/Llama-2-7b-hf"; from is then its snapshot) */
    char hub_repo[128];
    bool seq_len_default;  /* seq_len was not given: config.json's max_position_embeddings, at most 4096 */
    bool quantize_nf4;     /* model.quantize "nf4" / load_in_4bit: QLoRA's 4-bit base */
} spec_model;

/* "lora": PEFT's LoraConfig under its names. r = 0: no lora section (every
 * weight trains). Targets are module names as the model family calls its
 * projections (Hugging Face's, e.g. "q_proj"); they are checked against the
 * model at submission (model_lora.h), the spec checks only their form. */
#define SPEC_LORA_MAX_TARGETS 16
#define SPEC_LORA_NAME_MAX 32
#define SPEC_LORA_MAX_R 4096

typedef struct spec_lora {
    int r;                 /* rank; 0 = no LoRA */
    double alpha;          /* lora_alpha: the update is scaled by alpha / r (PEFT default 8) */
    double dropout;        /* lora_dropout on the adapter input (only 0 for now) */
    bool all_linear;       /* target_modules "all-linear": every linear layer but the head */
    int n_targets;         /* 0 and !all_linear: the family's default (PEFT's: q_proj, v_proj) */
    char targets[SPEC_LORA_MAX_TARGETS][SPEC_LORA_NAME_MAX];
} spec_lora;

#endif
