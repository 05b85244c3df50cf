#!/bin/bash
# The unit file passes systemd-analyze verify (skipped where systemd is not installed),
# and the install lays out binary, unit, sysusers, tmpfiles and a config that an
# upgrade keeps.
. "$(dirname "$0")/lib.sh"
src=${ACCUMD_SRC:?}
build=$(dirname "$ACCUMD")

dest=$ACC_TMP/dest
DESTDIR=$dest meson install -C "$build" --no-rebuild --quiet >"$ACC_TMP/install.log" 2>&1 ||
    fail "meson install failed: $(tail -5 "$ACC_TMP/install.log")"
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
    'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
root=$dest$prefix
for f in sbin/accumd lib/systemd/system/accumd.service lib/sysusers.d/accumd.conf \
         lib/tmpfiles.d/accumd.conf share/accumd/accumd.conf etc/accumd/accumd.conf \
         bin/accumctl share/man/man1/accumctl.1 share/bash-completion/completions/accumctl; do
    [ -e "$root/$f" ] || fail "meson install did not create $f"
done
unit=$root/lib/systemd/system/accumd.service
grep -qx 'Type=notify' "$unit" || fail "unit is not Type=notify"
grep -qx 'StateDirectory=accumd' "$unit" || fail "unit has no StateDirectory"
grep -q '^DeviceAllow=/dev/nvidiactl' "$unit" || fail "unit does not allow /dev/nvidiactl"
! grep -q '^PrivateDevices=yes' "$unit" || fail "PrivateDevices would hide the GPUs"
ok "install layout"

# an upgrade keeps the admin's config
echo "cpu_devices = 7" >>"$root/etc/accumd/accumd.conf"
DESTDIR=$dest meson install -C "$build" --no-rebuild --quiet >"$ACC_TMP/install2.log" 2>&1 ||
    fail "second meson install failed"
grep -qx 'cpu_devices = 7' "$root/etc/accumd/accumd.conf" || fail "reinstall overwrote the config"
ok "upgrade keeps config"

if ! command -v systemd-analyze >/dev/null; then
    echo "SKIP: systemd-analyze not installed"
    exit 77
fi
# verify against the built binary, placed where the unit expects it
sed "s|^ExecStart=[^ ]*|ExecStart=$root/sbin/accumd|" "$unit" >"$ACC_TMP/accumd.service"
out=$(systemd-analyze verify --man=no "$ACC_TMP/accumd.service" 2>&1)
rc=$?
# no systemd running in containers: only the unit's own problems count
bad=$(echo "$out" | grep -E 'accumd.service' | grep -viE 'Failed to connect|Unknown lvalue .*DeviceAllow' || true)
[ $rc -eq 0 ] || [ -z "$bad" ] || fail "systemd-analyze verify: $out"
[ -z "$bad" ] || fail "systemd-analyze verify reports: $bad"
ok "systemd-analyze verify"
