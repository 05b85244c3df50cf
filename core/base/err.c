#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int acc_err_set(acc_err *err, int code, const char *field, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void acc_err_prefix(acc_err *err, const char *fmt, ...)
{
    if (err == NULL)
        return;
    char head[256];
    va_list ap;
    va_start(ap, fmt);
    int hl = vsnprintf(head, sizeof head - 2, fmt, ap);
    va_end(ap);
    if (hl < 0)
        return;
    if ((size_t)hl > sizeof head - 3)
        hl = (int)sizeof head - 3;
    memcpy(head + hl, ": ", 3);
    hl += 2;
    size_t old = strnlen(err->msg, sizeof err->msg - 1);
    if ((size_t)hl + old >= sizeof err->msg)
        old = sizeof err->msg - 1 - (size_t)hl;
    memmove(err->msg + hl, err->msg, old);
    memcpy(err->msg, head, (size_t)hl);
    err->msg[hl + old] = '\0';
}

void acc_err_clear(acc_err *err)
{
    if (err != NULL)
        memset(err, 0, sizeof *err);
}

const char *acc_err_name(int code)
{
    switch (code) {
    case ACC_OK: return "ok";
    case ACC_EINVAL: return "invalid";
    case ACC_ENOMEM: return "no_memory";
    case ACC_EOOM: return "out_of_device_memory";
    case ACC_EIO: return "io";
    case ACC_ENOTFOUND: return "not_found";
    case ACC_ESTATE: return "conflict";
    case ACC_ECANCELLED: return "cancelled";
    case ACC_EDEVICE: return "device";
    case ACC_ETOOBIG: return "too_large";
    case ACC_EUNAVAIL: return "unavailable";
    case ACC_ELIMIT: return "too_many_requests";
    case ACC_ENOSPACE: return "no_space";
    default: return "internal";
    }
}
