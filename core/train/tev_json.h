/* tev_json: a trainer event (trainer.h's train_event) as one JSON object
 * and back, so that the events of a rank in another process reach whoever
 * launched it: a job's worker process to the daemon (one object per line on
 * their socketpair), rank 0 of an MPI job to its --events file.
 *
 * The object has "event" (the kind: step, eval, oom_adjust, checkpoint, log,
 * split_adjust, done, checkpoint_rejected, progress) and the kind's fields
 * under the names of train_event ("message" for msg); doubles are written
 * with 17 significant digits, so a loss read back is the same double, and a
 * non-finite one is null (read back as NaN). Decoding is strict: a missing
 * or mistyped field, or an unknown kind, is ACC_EINVAL naming it.
 */
#ifndef ACC_TEV_JSON_H
#define ACC_TEV_JSON_H

#include <jansson.h>

#include "err.h"
#include "trainer.h"

/* The event's kind as "event" spells it; NULL for none. */
const char *tev_kind_name(train_event_kind k);

/* A new object, or NULL when out of memory. */
json_t *tev_to_json(const train_event *ev);

/* The object back into *ev (zeroed first). */
int tev_from_json(const json_t *o, train_event *ev, acc_err *err);

#endif
