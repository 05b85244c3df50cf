/* fuzz_io: helpers for targets whose entry point takes a path: the input
 * goes to a file in a private temp directory (made once per process). */
#ifndef ACC_FUZZ_IO_H
#define ACC_FUZZ_IO_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

static char fuzz_dir_path[64];

static inline void fuzz_dir_remove(void) { fsu_rm_rf(fuzz_dir_path, NULL); }

/* The process's temp directory (created on the first call, removed at exit). */
static inline const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0] == '\0') {
        /* tmpfs when there is one: a file is written per input */
        const char *base = getenv("ACCUMD_FUZZ_TMP");
        struct stat sb;
        if (base == NULL)
            base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                                                      : "/tmp";
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/accumd-fuzz-XXXXXX", base);
        if (mkdtemp(fuzz_dir_path) == NULL)
            abort();
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Write `n` bytes to fuzz_dir()/name; the path goes to out. */
static inline void fuzz_write(const char *name, const uint8_t *data, size_t n, char *out, size_t outn)
{
    snprintf(out, outn, "%s/%s", fuzz_dir(), name);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        abort();
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, data + off, n - off);
        if (w <= 0)
            abort();
        off += (size_t)w;
    }
    close(fd);
}

#endif
