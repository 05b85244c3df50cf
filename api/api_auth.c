/* api_auth: the bearer token.
 *
 * The token lives in conf->token_file. When the file is missing the daemon
 * creates it, mode 0600 (O_EXCL, so two starts never race to different
 * tokens), with 32 random bytes in hex. Requests carry it as
 * "Authorization: Bearer <token>"; the comparison takes the same time
 * whatever the first differing byte.
 */
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_http.h"
#include "fsutil.h"
#include "log.h"

static int create_token(const char *path, char *token, size_t n, acc_err *err)
{
    unsigned char raw[32];
    if (n < 2 * sizeof raw + 1)
        return acc_err_set(err, ACC_EINTERNAL, NULL, "token buffer too small");
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return acc_err_set(err, ACC_EIO, "token_file", "getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(token + 2 * i, 3, "%02x", raw[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return acc_err_set(err, ACC_EIO, "token_file", "cannot create %s: %s", path, strerror(errno));
    char line[80];
    int len = snprintf(line, sizeof line, "%s\n", token);
    int rc = fsu_write_all(fd, line, (size_t)len, err);
    if (rc == 0 && fsync(fd) != 0)
        rc = acc_err_set(err, ACC_EIO, "token_file", "fsync %s: %s", path, strerror(errno));
    close(fd);
    if (rc != 0) {
        unlink(path);
        return rc;
    }
    acc_log(ACC_LOG_INFO, "auth", "created the API token in %s (mode 0600)", path);
    return fsu_fsync_parent(path, err);
}

static int read_token(const char *path, char *token, size_t n, acc_err *err)
{
    char *text = NULL;
    size_t len = 0;
    int rc = fsu_read_all(path, &text, &len, 4096, err);
    if (rc != 0)
        return rc;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    if (len < 16 || len >= n || strpbrk(text, " \t\r\n") != NULL) {
        free(text);
        return acc_err_set(err, ACC_EINVAL, "token_file", "%s must hold one token of 16..%zu characters", path,
                           n - 1);
    }
    memcpy(token, text, len + 1);
    free(text);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077) != 0)
        acc_log(ACC_LOG_WARN, "auth", "%s is readable by others (mode %03o); chmod 600 it", path,
                (unsigned)(st.st_mode & 0777));
    return 0;
}

int api_auth_load(const acc_conf *conf, char *token, size_t n, acc_err *err)
{
    if (access(conf->token_file, F_OK) != 0 && errno == ENOENT) {
        int rc = create_token(conf->token_file, token, n, err);
        if (rc == 0 || !(err && err->code == ACC_EIO && errno == EEXIST))
            return rc;
    }
    return read_token(conf->token_file, token, n, err);
}

const char *api_auth_bearer(struct MHD_Connection *conn)
{
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return h;
}

bool api_auth_ok(struct MHD_Connection *conn, const char *token)
{
    const char *h = api_auth_bearer(conn);
    if (h == NULL)
        return false;
    size_t hl = strlen(h), tl = strlen(token);
    unsigned char diff = hl != tl;
    for (size_t i = 0; i < tl; i++)
        diff |= (unsigned char)(token[i] ^ (i < hl ? h[i] : 0));
    return diff == 0;
}
