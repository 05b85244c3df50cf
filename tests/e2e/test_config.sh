#!/bin/bash
# Config: the file is read, --set and per-key flags override it in order,
# bad values and unknown keys are refused with the key named, --help/--version work.
. "$(dirname "$0")/lib.sh"

conf=$ACC_TMP/test.conf
cat >"$conf" <<CONF
# a comment
listen = 127.0.0.1:1
cpu_devices = 3
cpu_device_memory = 64M
log_level = debug
CONF

out=$("$ACCUMD" --config "$conf" --check-config) || fail "--check-config failed"
echo "$out" | grep -qx 'cpu_devices = 3' || fail "cpu_devices from file not applied: $out"
echo "$out" | grep -qx 'cpu_device_memory = 67108864' || fail "size suffix not applied: $out"

out=$("$ACCUMD" --config "$conf" --set cpu_devices=2 --cpu-device-memory 1G --state-dir /tmp/x --check-config) ||
    fail "overrides failed"
echo "$out" | grep -qx 'cpu_devices = 2' || fail "--set did not override the file: $out"
echo "$out" | grep -qx 'cpu_device_memory = 1073741824' || fail "--cpu-device-memory not applied: $out"
echo "$out" | grep -qx 'data_roots = /tmp/x/data' || fail "data_roots not derived from state_dir: $out"
echo "$out" | grep -qx 'require_token = false' || fail "loopback should not force the token: $out"

out=$("$ACCUMD" --listen 0.0.0.0:8470 --check-config) || fail "--listen failed"
echo "$out" | grep -qx 'require_token = true' || fail "non-loopback listen must require the token: $out"

err=$("$ACCUMD" --set cpu_devices=zero --check-config 2>&1); rc=$?
expect_eq "exit on bad value" "$rc" 2
echo "$err" | grep -q 'cpu_devices' || fail "error does not name the key: $err"

err=$("$ACCUMD" --set no_such_key=1 --check-config 2>&1); rc=$?
expect_eq "exit on unknown key" "$rc" 2
echo "$err" | grep -q "unknown config key 'no_such_key'" || fail "unknown key not named: $err"

printf 'cpu_devices = 2\nbogus line\n' >"$ACC_TMP/bad.conf"
err=$("$ACCUMD" --config "$ACC_TMP/bad.conf" --check-config 2>&1); rc=$?
expect_eq "exit on bad file" "$rc" 2
echo "$err" | grep -q 'bad.conf:2' || fail "bad line not located: $err"

err=$("$ACCUMD" --config "$ACC_TMP/missing.conf" --check-config 2>&1); rc=$?
expect_eq "exit on missing file" "$rc" 2

"$ACCUMD" --help | grep -q -- '--config' || fail "--help does not document --config"
"$ACCUMD" --version | grep -q '^accumd ' || fail "--version"

# the shipped config parses
"$ACCUMD" --config "$(dirname "$0")/../../etc/accumd.conf" --check-config >/dev/null ||
    fail "etc/accumd.conf does not parse"
ok "config file, overrides, errors"

# a port already in use is a clear start error, not a crash
acc_start
STATE2=$ACC_TMP/state2
mkdir -p "$STATE2"
err=$("$ACCUMD" --set listen="$(cat "$STATE/accumd.addr")" --set state_dir="$STATE2" 2>&1); rc=$?
expect_eq "exit when the port is taken" "$rc" 1
echo "$err" | grep -q 'cannot listen' || fail "port in use not reported: $err"
acc_stop
ok "port in use"
