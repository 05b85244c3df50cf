/* fuzz_conf: the daemon config file parser (daemon/daemon_conf.c: inih,
 * then conf_set for each pair) and conf_finalize's cross-key checks.
 * The listen host is reset to a numeric loopback address before
 * finalizing: finalize resolves it, and a fuzzer must not query DNS. */
#include <stdint.h>

#include "daemon.h"
#include "fuzz_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[128];
    fuzz_write("accumd.conf", data, size, path, sizeof path);
    acc_conf c;
    acc_err err = {0};
    conf_defaults(&c);
    int rc = daemon_conf_load(&c, path, &err);
    if (rc != 0) {
        if (err.msg[0] == '\0')
            abort(); /* every refusal says why */
        return 0;
    }
    snprintf(c.listen_host, sizeof c.listen_host, "127.0.0.1");
    if (conf_finalize(&c, &err) == 0 &&
        (c.max_pending_connections < 1 || c.header_timeout > c.request_timeout || c.cpu_threads_per_device < 1))
        abort();
    return 0;
}
