/* err: errors as values.
 *
 * Every fallible function in accumd takes an `acc_err *` (may be NULL) and
 * returns an `int` status: 0 on success, a negative ACC_E* code on failure.
 * On failure the callee fills the error with the code, the public field path
 * it concerns (e.g. "optimizer.lr", empty when none) and a one-line message.
 * The API layer maps codes to HTTP statuses; nothing else interprets them.
 */
#ifndef ACC_ERR_H
#define ACC_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum acc_errcode {
    ACC_OK = 0,
    ACC_EINVAL = -1,    /* bad input: a spec, a config value, a request */
    ACC_ENOMEM = -2,    /* host allocation failed */
    ACC_EOOM = -3,      /* device memory budget exceeded (adaptable) */
    ACC_EIO = -4,       /* file system or socket error */
    ACC_ENOTFOUND = -5, /* no such job / file / route */
    ACC_ESTATE = -6,    /* operation not valid in the current state */
    ACC_ECANCELLED = -7,/* stopped on request */
    ACC_EDEVICE = -8,   /* device / driver / communicator failure */
    ACC_ETOOBIG = -9,   /* request or value over a configured limit */
    ACC_EINTERNAL = -10,
    ACC_EUNAVAIL = -11, /* a service (the job store) is down or read-only: retry later */
    ACC_ELIMIT = -12,   /* a configured quota is reached (queued jobs, event streams): retry later */
    ACC_ENOSPACE = -13, /* a file system is full or over quota (ENOSPC, EDQUOT): retry when it has room */
};

typedef struct acc_err {
    int code;
    char field[128];
    char msg[512];
} acc_err;

/* Fill `err` (if non-NULL) and return `code`, so callers can write
 * `return acc_err_set(err, ACC_EINVAL, "lr", "must be > 0, got %g", lr);` */
int acc_err_set(acc_err *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefix the message of an already-set error with context ("loading x: ..."). */
void acc_err_prefix(acc_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void acc_err_clear(acc_err *err);

/* Short stable name of a code, e.g. "invalid" for ACC_EINVAL. */
const char *acc_err_name(int code);

#ifdef __cplusplus
}
#endif

#endif
