#!/bin/bash
# dash_load.sh: what the dashboard costs the daemon (a benchmark, not a test).
#
#   bench/dash_load.sh [ACCUMD_BINARY]    (default: build/accumd; use a release build)
#
# 1. the training step time of a job (2 layers, 128 channels, seq 128, B=16,
#    m=4, one CPU device) with no job page open, with 20 emulated job pages
#    (what a page asks of the daemon: its job's SSE stream, GET /v1/jobs/{id}
#    every 2 s, /metrics and /devices once), and, with BROWSER_PAGES=1, with
#    20 real job pages in headless Chromium on this same machine (then the
#    browser's own CPU time, 5 charts redrawn per page per step, is in the
#    figure: on a 2-core host it swamps the training); runs alternate;
#    for each run the step time (from its median tokens/s) and the daemon's
#    CPU time per step (/proc/PID/stat, user + system), which a busy host
#    disturbs far less than the wall-clock step time;
# 2. the time from POST /v1/jobs to the new job's row in an open job list
#    (headless Chromium, the page polls every 2 s), 10 submissions.
# The browser parts need node, chromium and playwright-core (installed as
# tests/e2e/test_dashboard.sh does); they are left out without them.
# Prints markdown tables for bench/RESULTS.md.
set -eu
ACCUMD=${1:-build/accumd}
PAGES=${PAGES:-20}
STEPS=${STEPS:-60}
SRC=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/accumd-dash.XXXXXX)
pid=
bg=()
cleanup() {
    set +e
    [ ${#bg[@]} -gt 0 ] && kill "${bg[@]}" 2>/dev/null
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/data"
for i in 1 2 3 4; do cat /usr/share/common-licenses/GPL-3; done >"$tmp/data/corpus.txt"
"$ACCUMD" --set listen=127.0.0.1:0 --set state_dir="$tmp" --set devices=cpu --set cpu_devices=1 \
    --set cpu_device_memory=1G --set log_level=warn ${THREADS:+--set cpu_threads_per_device=$THREADS} >"$tmp/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -s "$tmp/accumd.addr" ] && break; sleep 0.1; done
B=http://$(cat "$tmp/accumd.addr")

job() { # NAME STEPS
    printf '{"name":"%s","model":{"n_layer":2,"n_head":4,"n_embd":128,"seq_len":128,"vocab_size":256},"data":{"train":"corpus.txt"},"train_batch_size":16,"train_micro_batch_size_per_gpu":4,"max_steps":%d}' "$1" "$2"
}
submit() { curl -s -X POST --data-binary "$(job "$1" "$2")" "$B/v1/jobs" | jq -r .id; }
state() { curl -s "$B/v1/jobs/$1" | jq -r .state; }
wait_done() { while case $(state "$1") in running|queued) true;; *) false;; esac; do sleep 0.2; done; }
# the daemon's CPU time so far (user + system, clock ticks): unlike the step
# time, it hardly depends on what else the machine runs
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
step_time() { # seconds per step from the run's median tokens/s
    curl -s "$B/v1/jobs/$1/metrics" |
        jq '(.steps | map(.tokens_per_s) | sort | .[length / 2 | floor]) as $t | 16 * 128 / $t * 10000 | round / 10000'
}
# one emulated job page: the stream, and the job polled every 2 s
fake_page() {
    curl -s -o /dev/null "$B/v1/jobs/$1/metrics"
    curl -s -o /dev/null "$B/v1/devices"
    curl -sN "$B/v1/jobs/$1/events" >/dev/null &
    bg+=($!)
    (while [ -d "$tmp" ]; do curl -s -o /dev/null "$B/v1/jobs/$1"; sleep 2; done) >/dev/null 2>&1 &
    bg+=($!)
}
stop_bg() { [ ${#bg[@]} -gt 0 ] && kill "${bg[@]}" 2>/dev/null; wait "${bg[@]}" 2>/dev/null; bg=(); }

PW=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/web-$(sha256sum "$SRC/tests/web/package-lock.json" | cut -c1-16)
browser=no
if command -v node >/dev/null && [ -x /usr/bin/chromium ]; then
    if [ ! -f "$PW/node_modules/playwright-core/package.json" ]; then
        mkdir -p "$PW" && cp "$SRC/tests/web/package.json" "$SRC/tests/web/package-lock.json" "$PW/" &&
            (cd "$PW" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null 2>&1) || true
    fi
    [ -f "$PW/node_modules/playwright-core/package.json" ] && browser=yes
fi

# one measured run: a blocker holds the device while the watchers of KIND
# attach to the queued job, so they are all there from its first step
run() { # KIND NAME
    local blk j live
    blk=$(submit "blocker-$2" 1000000)
    j=$(submit "$2" "$STEPS")
    rm -f "$tmp/ready"
    case $1 in
    curl) for _ in $(seq 1 "$PAGES"); do fake_page "$j"; done ;;
    pages)
        BASE=$B PW=$PW MODE=pages N=$PAGES JOB=$j READY=$tmp/ready node "$SRC/bench/dash_bench.mjs" >"$tmp/live" &
        bg+=($!)
        for _ in $(seq 1 1200); do [ -f "$tmp/ready" ] && break; sleep 0.1; done ;;
    esac
    curl -s -o /dev/null -X DELETE "$B/v1/jobs/$blk"
    while [ "$(state "$j")" = queued ]; do sleep 0.05; done
    local c0 c1
    c0=$(cpu_ticks)
    wait_done "$j"
    c1=$(cpu_ticks)
    if [ "$1" = pages ]; then
        wait "${bg[@]}"
        bg=()
        live=$(cat "$tmp/live")
        [ "$live" = "$PAGES" ] || echo "warning: only $live of $PAGES pages got steps" >&2
    fi
    stop_bg
    echo "$(step_time "$j") $(awk -v a="$c0" -v b="$c1" -v n="$STEPS" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.4f", (b - a) / hz / n }')"
}
declare -A t
for round in 1 2; do
    t[none$round]=$(run none "quiet$round")
    t[curl$round]=$(run curl "curl$round")
    if [ "${BROWSER_PAGES:-0}" = 1 ] && [ $browser = yes ]; then t[pages$round]=$(run pages "pages$round"); fi
done
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (b / a - 1) * 100 }'; }
f1() { echo "${1%% *}"; }   # step time of a "step_time cpu_per_step" pair
f2() { echo "${1##* }"; }   # CPU seconds per step
row() { # LABEL KIND
    local a=${t[${2}1]} b=${t[${2}2]}
    if [ "$2" = none ]; then
        echo "| $1 | $(f1 "$a") | $(f1 "$b") | | $(f2 "$a") | $(f2 "$b") | |"
    else
        echo "| $1 | $(f1 "$a") | $(f1 "$b") | $(pct "$(f1 "${t[none1]}")" "$(f1 "$a")"), $(pct "$(f1 "${t[none2]}")" "$(f1 "$b")") |" \
             "$(f2 "$a") | $(f2 "$b") | $(pct "$(f2 "${t[none1]}")" "$(f2 "$a")"), $(pct "$(f2 "${t[none2]}")" "$(f2 "$b")") |"
    fi
}
echo "| run ($STEPS steps, B=16, 2x128 GPT-2, 1 CPU device) | s/step, round 1 | round 2 | vs none | daemon CPU s/step, round 1 | round 2 | vs none |"
echo "|---|---|---|---|---|---|---|"
row "no job page open" none
row "$PAGES emulated job pages (curl: SSE + GET every 2 s)" curl
if [ -n "${t[pages1]:-}" ]; then row "$PAGES job pages in headless Chromium (same machine)" pages; fi
if [ $browser = yes ]; then
    ms=$(BASE=$B PW=$PW MODE=list N=10 SPEC="$(job listed 1)" node "$SRC/bench/dash_bench.mjs")
    echo
    echo "time from POST /v1/jobs to the row in an open job list (ms, 10 submissions): $ms"
    echo "$ms" | tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { printf "median %d ms, max %d ms\n", v[int((NR + 1) / 2)], v[NR] }'
fi
