/* api_users: who sends a request, from its bearer token.
 *
 * The users file (config key users_file) has one user a line:
 *
 *   # name   role   token hash
 *   alice    user   sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
 *
 * name: 1..63 of [A-Za-z0-9._-] ("anonymous" is reserved); role: admin or
 * user; the hash: SHA-256 (OpenSSL's libcrypto) of the token, in hex. The
 * daemon never stores a user's token, only its hash; `accumd --hash-token`
 * and `accumctl user add` make the lines. Lookup hashes the presented token
 * and compares it with every entry in constant time, so neither the answer
 * nor its time says how close a guess came. The file is read at start (a
 * bad line stops the start with its line number) and again on SIGHUP (a
 * bad file then keeps the users of before).
 */
#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api_http.h"
#include "fsutil.h"
#include "log.h"

#define USERS_MAX_FILE (4u << 20)

int api_token_hash(const char *token, unsigned char out[API_HASH_LEN])
{
    unsigned int n = 0;
    if (EVP_Digest(token, strlen(token), out, &n, EVP_sha256(), NULL) != 1 || n != API_HASH_LEN)
        return -1;
    return 0;
}

void api_hash_hex(const unsigned char h[API_HASH_LEN], char out[2 * API_HASH_LEN + 1])
{
    for (int i = 0; i < API_HASH_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int parse_hash(const char *s, unsigned char out[API_HASH_LEN])
{
    if (strncmp(s, "sha256:", 7) != 0 || strlen(s + 7) != 2 * API_HASH_LEN)
        return -1;
    s += 7;
    for (int i = 0; i < API_HASH_LEN; i++) {
        int hi = unhex(s[2 * i]), lo = unhex(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

bool api_user_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= API_NAME_MAX)
        return false;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-')
            return false;
    return true;
}

int api_role_parse(const char *s)
{
    return !strcmp(s, "admin") ? API_ROLE_ADMIN : !strcmp(s, "user") ? API_ROLE_USER : -1;
}

const char *api_role_name(int role) { return role == API_ROLE_ADMIN ? "admin" : "user"; }

static int add_user(api_users *us, const api_user *u, const char *path, int lineno, acc_err *err)
{
    for (size_t i = 0; i < us->n; i++) {
        if (!strcmp(us->u[i].name, u->name))
            return acc_err_set(err, ACC_EINVAL, "users_file", "%s:%d: user '%s' is listed twice", path, lineno,
                               u->name);
        if (!memcmp(us->u[i].hash, u->hash, API_HASH_LEN))
            return acc_err_set(err, ACC_EINVAL, "users_file", "%s:%d: user '%s' has the token of '%s'", path,
                               lineno, u->name, us->u[i].name);
    }
    if (us->n == us->cap) {
        size_t cap = us->cap ? us->cap * 2 : 16;
        api_user *nu = realloc(us->u, cap * sizeof *nu);
        if (nu == NULL)
            return acc_err_set(err, ACC_ENOMEM, NULL, "out of memory for the users");
        us->u = nu;
        us->cap = cap;
    }
    us->u[us->n++] = *u;
    return 0;
}

/* One line: "name role sha256:hex", blank, or a # comment. */
static int parse_line(api_users *us, char *line, const char *path, int lineno, acc_err *err)
{
    char *save = NULL, *f[4];
    int nf = 0;
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
    for (char *t = strtok_r(line, " \t\r", &save); t != NULL && nf < 4; t = strtok_r(NULL, " \t\r", &save))
        f[nf++] = t;
    if (nf == 0)
        return 0;
    if (nf != 3)
        return acc_err_set(err, ACC_EINVAL, "users_file",
                           "%s:%d: want 'name role sha256:<hex>' (3 fields), got %d", path, lineno, nf);
    api_user u = {0};
    if (!api_user_name_ok(f[0]) || !strcmp(f[0], API_ANONYMOUS))
        return acc_err_set(err, ACC_EINVAL, "users_file",
                           "%s:%d: bad user name '%s' (1..63 of A-Z a-z 0-9 . _ -; '%s' is reserved)", path,
                           lineno, f[0], API_ANONYMOUS);
    snprintf(u.name, sizeof u.name, "%s", f[0]);
    if ((u.role = api_role_parse(f[1])) < 0)
        return acc_err_set(err, ACC_EINVAL, "users_file", "%s:%d: role must be admin or user, got '%s'", path,
                           lineno, f[1]);
    if (parse_hash(f[2], u.hash) != 0)
        return acc_err_set(err, ACC_EINVAL, "users_file",
                           "%s:%d: the token hash must be sha256: and 64 hex digits (accumd --hash-token)", path,
                           lineno);
    return add_user(us, &u, path, lineno, err);
}

int api_users_load(const char *path, api_users *us, acc_err *err)
{
    char *text = NULL;
    size_t len = 0;
    memset(us, 0, sizeof *us);
    int rc = fsu_read_all(path, &text, &len, USERS_MAX_FILE, err);
    if (rc != 0) {
        acc_err_prefix(err, "users_file: ");
        return rc;
    }
    int lineno = 0;
    for (char *p = text, *nl; rc == 0 && p != NULL && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl != NULL)
            *nl = '\0';
        rc = parse_line(us, p, path, ++lineno, err);
    }
    free(text);
    if (rc != 0) {
        api_users_free(us);
        return rc;
    }
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 002) != 0)
        acc_log(ACC_LOG_WARN, "auth", "%s is writable by others (mode %03o): anyone could add an admin", path,
                (unsigned)(st.st_mode & 0777));
    acc_log(ACC_LOG_INFO, "auth", "%zu user(s) from %s", us->n, path);
    return 0;
}

void api_users_free(api_users *us)
{
    free(us->u);
    memset(us, 0, sizeof *us);
}

const api_user *api_users_find(const api_users *us, const char *token)
{
    unsigned char h[API_HASH_LEN];
    if (us->n == 0 || api_token_hash(token, h) != 0)
        return NULL;
    const api_user *hit = NULL;
    for (size_t i = 0; i < us->n; i++) { /* every entry, whatever matched */
        unsigned char diff = 0;
        for (int k = 0; k < API_HASH_LEN; k++)
            diff |= (unsigned char)(h[k] ^ us->u[i].hash[k]);
        if (diff == 0)
            hit = &us->u[i];
    }
    return hit;
}
