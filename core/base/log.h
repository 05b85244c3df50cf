/* log: one line per event on stderr, in a form journald and terminals read well.
 *
 * Under systemd (JOURNAL_STREAM set) each line starts with the syslog
 * priority "<N>" so journald files it at the right level; on a terminal it
 * starts with a UTC timestamp and the level name. Lines are written with one
 * write(2) each, so threads never interleave within a line.
 *
 * The threshold and the target are set once by the daemon at start-up
 * (log_init) before any thread exists, and only read afterwards.
 */
#ifndef ACC_LOG_H
#define ACC_LOG_H

enum acc_log_level { ACC_LOG_ERROR = 3, ACC_LOG_WARN = 4, ACC_LOG_INFO = 6, ACC_LOG_DEBUG = 7 };

/* level_name: "error" | "warn" | "info" | "debug". path: NULL for stderr,
 * else a file appended to (reopened by log_reopen on SIGHUP). */
int log_init(const char *level_name, const char *path);
int log_reopen(void);

void acc_log(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
