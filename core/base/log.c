#include "log.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Write-once settings (see log.h): set in log_init before threads start. */
static struct {
    int threshold;
    int fd;
    int journal;
    char path[4096];
} log_cfg = {ACC_LOG_INFO, 2, 0, ""};

static int level_of(const char *name)
{
    if (name == NULL) return ACC_LOG_INFO;
    if (!strcmp(name, "error")) return ACC_LOG_ERROR;
    if (!strcmp(name, "warn")) return ACC_LOG_WARN;
    if (!strcmp(name, "debug")) return ACC_LOG_DEBUG;
    return ACC_LOG_INFO;
}

int log_init(const char *level_name, const char *path)
{
    log_cfg.threshold = level_of(level_name);
    log_cfg.journal = getenv("JOURNAL_STREAM") != NULL && path == NULL;
    if (path != NULL && path[0] != '\0') {
        snprintf(log_cfg.path, sizeof log_cfg.path, "%s", path);
        return log_reopen();
    }
    return 0;
}

int log_reopen(void)
{
    if (log_cfg.path[0] == '\0')
        return 0;
    int fd = open(log_cfg.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return -1;
    int old = log_cfg.fd;
    log_cfg.fd = fd;
    if (old > 2)
        close(old);
    return 0;
}

static const char *level_word(int level)
{
    switch (level) {
    case ACC_LOG_ERROR: return "error";
    case ACC_LOG_WARN: return "warn";
    case ACC_LOG_INFO: return "info";
    default: return "debug";
    }
}

void acc_log(int level, const char *module, const char *fmt, ...)
{
    if (level > log_cfg.threshold)
        return;
    char line[2048];
    int n;
    if (log_cfg.journal) {
        n = snprintf(line, sizeof line, "<%d>%s: ", level, module);
    } else {
        struct timeval tv;
        struct tm tm;
        gettimeofday(&tv, NULL);
        gmtime_r(&tv.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level_word(level), module);
    }
    if (n < 0 || (size_t)n >= sizeof line)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    for (size_t i = (size_t)n; i < len; i++)
        if (line[i] == '\n')
            line[i] = ' '; /* one event, one line */
    line[len++] = '\n';
    ssize_t w = write(log_cfg.fd, line, len);
    (void)w;
}
