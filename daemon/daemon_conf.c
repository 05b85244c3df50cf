/* daemon_conf: read the config file (INI-style key = value, '#' comments)
 * through inih, applying each pair with conf_set so the file and --set share
 * one validation. */
#include <ini.h>
#include <stdio.h>
#include <string.h>

#include "daemon.h"

typedef struct load_state {
    acc_conf *conf;
    acc_err *err;
    const char *path;
    int failed;
} load_state;

static int on_pair(void *user, const char *section, const char *name, const char *value)
{
    load_state *st = user;
    if (st->failed)
        return 0;
    if (section != NULL && section[0] != '\0') {
        acc_err_set(st->err, ACC_EINVAL, name, "sections are not used ([%s])", section);
        st->failed = 1;
        return 0;
    }
    if (conf_set(st->conf, name, value, st->err) != 0) {
        st->failed = 1;
        return 0;
    }
    return 1;
}

int daemon_conf_load(acc_conf *c, const char *path, acc_err *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return acc_err_set(err, ACC_EIO, "config", "cannot open config file %s: %m", path);
    load_state st = {.conf = c, .err = err, .path = path};
    int rc = ini_parse_file(f, on_pair, &st);
    fclose(f);
    if (st.failed) { /* inih returns the line of the handler's error */
        acc_err_prefix(err, "%s:%d", path, rc);
        return err ? err->code : ACC_EINVAL;
    }
    if (rc != 0)
        return acc_err_set(err, ACC_EINVAL, "config", "%s:%d: not a 'key = value' line", path, rc);
    return 0;
}
