/* job_train_cfg: the one conversion of a job spec into the engine's
 * configuration.
 *
 * The service (jobs, api, daemon) parses and validates a job_spec; the
 * engine reads a train_cfg (train_cfg.h) and never the spec. This is the
 * only place the two meet: every field the engine reads is copied, the
 * service's own (priority, max_restarts, the names as written, the ignored
 * keys) are not. Built once per use; the engine never writes back.
 */
#ifndef ACC_JOB_TRAIN_CFG_H
#define ACC_JOB_TRAIN_CFG_H

#include "job_spec.h"
#include "train_cfg.h"

/* `out` = the engine's part of `s` (pure, cannot fail). */
void job_spec_train_cfg(const job_spec *s, train_cfg *out);

#endif
