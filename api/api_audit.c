/* api_audit: who submitted and cancelled what, and when.
 *
 * state_dir/audit.log, append-only (O_APPEND, never rewritten or
 * truncated by the daemon), one JSON object a line:
 *
 *   {"time":"2026-12-02T18:30:01.120Z","user":"alice","role":"user",
 *    "action":"cancel","job":"j000003","result":"forbidden","message":"..."}
 *
 * Each line is one write(2) followed by fdatasync before the answer goes
 * out, so an action the client saw acknowledged is in the file. The same
 * record goes to the journal (module "audit"). A write that fails is
 * logged as an error; it never fails the action itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_http.h"
#include "fsutil.h"
#include "job.h"
#include "log.h"

int api_audit_open(api_audit *a, const char *state_dir, acc_err *err)
{
    a->fd = -1;
    if (snprintf(a->path, sizeof a->path, "%s/audit.log", state_dir) >= (int)sizeof a->path)
        return acc_err_set(err, ACC_EINVAL, "state_dir", "state_dir is too long for audit.log");
    a->fd = open(a->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (a->fd < 0)
        return acc_err_set(err, ACC_EIO, "state_dir", "cannot open %s: %s", a->path, strerror(errno));
    return fsu_fsync_parent(a->path, err);
}

void api_audit_close(api_audit *a)
{
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
}

void api_audit_record(api_audit *a, const api_ident *who, const char *action, const char *job_id,
                      const char *result, const char *message)
{
    json_t *o = json_pack("{s:o, s:s, s:s, s:s, s:s?, s:s, s:s?}", "time", job_time_json(job_now()), "user",
                          who->name, "role", api_role_name(who->role), "action", action, "job", job_id, "result",
                          result, "message", message);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    acc_log(ACC_LOG_INFO, "audit", "%s (%s) %s %s: %s%s%s", who->name, api_role_name(who->role), action,
            job_id ? job_id : "-", result, message ? ": " : "", message ? message : "");
    if (text == NULL) {
        acc_log(ACC_LOG_ERROR, "audit", "out of memory writing an audit record");
        return;
    }
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    acc_err err = {0};
    if (line == NULL) {
        free(text);
        acc_log(ACC_LOG_ERROR, "audit", "out of memory writing an audit record");
        return;
    }
    line[n++] = '\n';
    line[n] = '\0';
    if (a->fd < 0)
        acc_log(ACC_LOG_ERROR, "audit", "%s is not open; record lost", a->path);
    else if (fsu_write_all(a->fd, line, n, &err) != 0 || fdatasync(a->fd) != 0)
        acc_log(ACC_LOG_ERROR, "audit", "%s: %s", a->path, err.msg[0] ? err.msg : strerror(errno));
    free(line);
}
