#!/usr/bin/env bash
# The one-call GPU check, for a machine with an NVIDIA GPU, the CUDA toolkit,
# NCCL (the nvidia-nccl Python package will do) and no Debian packages.
#
# Before (on the Debian build machine):  bash bench/gpu-deps.sh
#   -> .deps/root holds accumd's libraries, meson and pkgconf, unpacked from .debs.
# Then, on the GPU machine, in the repository root, carrying .deps/root only
# (about 57 MiB; .deps/debs would push the carry past its 64 MiB):
#   bash bench/gpu-check.sh            (7 minutes at most: GPU_CHECK_BUDGET_S)
#
# It builds with -Dcuda=enabled, runs the GPU tests (CUDA kernels, the model
# and the whole trainer against the CPU reference, NCCL), each on its own
# with its own limit, then the GPU benchmark (GPT-2 124M: tokens/s, MFU, a
# per-op profile), then the daemon itself with devices = auto
# (bench/gpu-daemon.py: an fp32 and a bf16 job over HTTP), and prints a short
# table last. Every limit is cut to what is left of the budget, so a hang
# costs its own step, never the table. $OUT (the device tool), else
# bench/out, gets two files: gpu-check.log (everything, with a ROW line per
# result as it comes) and gpu-daemon-accumd.log.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$PWD
R=$top/.deps/root
OUTDIR=${OUT:-$top/bench/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu-check.log
: >"$LOG"
work=$(mktemp -d /tmp/accumd-gpu-check.XXXXXX) # per-step outputs, copied into the log
T_END=$((SECONDS + ${GPU_CHECK_BUDGET_S:-420}))
say() { echo "$*" | tee -a "$LOG"; }
rows=()
row() {
    local r
    r=$(printf '%-34s %-8s %s' "$1" "$2" "$3")
    rows+=("$r")
    echo "ROW $r" >>"$LOG"
}
# left N: N seconds, or what is left of the budget if less (at least 5)
left() {
    local l=$((T_END - SECONDS))
    l=$((l < 5 ? 5 : l))
    echo $((l < $1 ? l : $1))
}
summary() {
    say ""
    say "== gpu-check summary ($(date -u +%F), $SECONDS s)"
    printf '%s\n' "${rows[@]}" | tee -a "$LOG"
}

[ -d "$R" ] || { say "no .deps/root: run bench/gpu-deps.sh on the build machine and carry .deps/root"; exit 2; }

# --- environment. The carried Debian libraries are for accumd's programs
# only (withlibs); the machine's own tools (python3, gcc, nvcc) keep theirs.
deplibs=$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/openblas-pthread:$R/lib/x86_64-linux-gnu
export PKG_CONFIG_LIBDIR=$R/usr/lib/x86_64-linux-gnu/pkgconfig:$R/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$R/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$R
pkgconf=$work/pkgconf # the carried pkgconf needs the carried libpkgconf
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$R/usr/lib/x86_64-linux-gnu" "$R/usr/bin/pkgconf" >"$pkgconf"
chmod +x "$pkgconf"
export PKG_CONFIG=$pkgconf
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
[ -n "$nvcc" ] || { say "no nvcc on this machine"; exit 2; }
cudaroot=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null ||
       python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
# the nvidia-nccl wheel ships lib/libnccl.so.2 only; the linker wants libnccl.so
if [ -n "$nccl" ] && [ ! -e "$nccl/lib/libnccl.so" ] && [ -e "$nccl/lib/libnccl.so.2" ]; then
    shim=$work/nccl # outside the tree: meson refuses in-tree absolute include dirs
    mkdir -p "$shim/lib"
    ln -s "$nccl/include" "$shim/include"
    ln -s "$nccl/lib/libnccl.so.2" "$shim/lib/libnccl.so"
    ln -s "$nccl/lib/libnccl.so.2" "$shim/lib/libnccl.so.2"
    nccl=$shim
fi
withlibs() { LD_LIBRARY_PATH=$deplibs:$cudaroot/lib64${nccl:+:$nccl/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
export NCCL_DEBUG=${NCCL_DEBUG:-WARN} # an init failure explains itself in the log
# meson: the machine's own when it has one (the GPU image ships it), else the carried .deb's
if command -v meson >/dev/null 2>&1 && meson --version >/dev/null 2>&1; then meson=(meson)
else meson=(env PYTHONPATH="$R/usr/lib/python3/dist-packages" python3 "$R/usr/bin/meson"); fi
say "== $(date -u +%FT%TZ) gpu-check on $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "   nvcc $("$nvcc" --version | tail -1), cuda root $cudaroot, nccl ${nccl:-in the toolkit}, meson ${meson[*]}"
say "   cuda libraries: $(ls "$cudaroot"/lib64/libcudart.so* "$cudaroot"/lib64/libcublasLt.so* "$cudaroot"/lib64/libcublas.so* 2>&1 | tr '\n' ' ')"

# --- build (the link finds the carried libraries' own needs through -rpath-link)
build=$top/build/gpu
t0=$SECONDS
rm -rf "$build" # a fresh tree: meson's --wipe refuses a directory that is not a build yet
if LDFLAGS="-Wl,-rpath-link,$deplibs" "${meson[@]}" setup "$build" -Dcuda=enabled \
        -Dbuildtype=release -Dtests=true -Dcudatoolkit="$cudaroot" ${nccl:+-Dnccl_dir="$nccl"} \
        >>"$LOG" 2>&1 &&
   timeout -k 10 "$(left 240)" ninja -C "$build" -j16 >>"$LOG" 2>&1; then
    row "build (-Dcuda=enabled)" ok "$((SECONDS - t0)) s"
else
    row "build (-Dcuda=enabled)" FAIL "see gpu-check.log"
    tail -30 "$LOG"
    summary
    exit 1
fi

# --- libraries: everything accumd's programs need resolves
missing=$(withlibs ldd "$build/accumd" "$build"/tests/test_gpu_cuda_trainer 2>&1 | grep 'not found' | sort -u | tr -s ' \t' ' ')
if [ -n "$missing" ]; then row "shared libraries" FAIL "$missing"; else row "shared libraries" ok "all resolve"; fi

# --- GPU tests: CUDA vs CPU reference, each on its own with its own limit, so
# one that hangs (a collective) costs its limit, not the rest of the check
# (the experimental tiled attention last)
for exe in $(ls -d "$build"/tests/test_gpu_* | grep -v flash) "$build"/tests/test_gpu_cuda_flash; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    t=${exe##*/test_gpu_}
    t0=$SECONDS
    withlibs timeout -k 10 "$(left 60)" "$exe" >"$work/gpu_$t.txt" 2>&1
    rc=$?
    { echo "---- gpu_$t (exit $rc)"; cat "$work/gpu_$t.txt"; } >>"$LOG"
    case $rc in
        0) verdict=ok ;;
        77) verdict=SKIPPED ;; # on the GPU machine: the GPU was not seen
        124 | 137) verdict=TIMEOUT ;;
        *) verdict=FAIL ;;
    esac
    last=$(grep -v '^$' "$work/gpu_$t.txt" | tail -1 | cut -c1-70)
    row "gpu_$t" "$verdict" "$((SECONDS - t0)) s: $last"
done

# --- benchmarks: each prints "RESULT key value" lines
for b in "$build"/bench/bench_gpu*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    name=$(basename "$b")
    withlibs timeout -k 10 "$(left 120)" "$b" >"$work/$name.txt" 2>&1
    rc=$?
    { echo "---- $name (exit $rc)"; cat "$work/$name.txt"; } >>"$LOG"
    while read -r _ key val; do row "$name $key" "" "$val"; done < <(grep '^RESULT ' "$work/$name.txt")
    if [ $rc -ne 0 ]; then row "$name" FAIL "exit $rc"
    elif ! grep -q '^RESULT ' "$work/$name.txt"; then row "$name" "" "$(head -1 "$work/$name.txt")"; fi
done

# --- the daemon itself on the GPU: devices = auto (the GPUs once they pass the
# self-test), jobs over HTTP (fp32, bf16)
t0=$SECONDS
dstate=$work/daemon
mkdir -p "$dstate"
# the carried libraries for accumd only, not for the machine's python3
GPU_DAEMON_DEADLINE=60 GPU_DAEMON_LIBS=$deplibs:$cudaroot/lib64${nccl:+:$nccl/lib} \
    timeout -k 10 "$(left 150)" \
    python3 "$top/bench/gpu-daemon.py" "$build/accumd" "$top" "$dstate" >"$work/gpu-daemon.txt" 2>&1
rc=$?
{ echo "---- gpu-daemon (exit $rc)"; cat "$work/gpu-daemon.txt"; } >>"$LOG"
cp "$dstate/daemon.log" "$OUTDIR/gpu-daemon-accumd.log" 2>/dev/null
while read -r _ key val; do row "$key" "" "$val"; done < <(grep '^RESULT ' "$work/gpu-daemon.txt")
row "daemon on GPU (devices = auto)" "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$((SECONDS - t0)) s"

# --- with time left: the EXPERIMENTAL tiled attention (gpu_cuda_flash above
# says whether it is right), then a larger micro batch
b=$build/bench/bench_gpu_train
if [ -x "$b" ] && [ $((T_END - SECONDS)) -gt 90 ]; then
    withlibs timeout -k 10 "$(left 80)" "$b" --flash --steps 6 --other-steps 0 --profile-steps 3 \
        >"$work/bench_flash.txt" 2>&1
    rc=$?
    { echo "---- bench_gpu_train --flash (exit $rc)"; cat "$work/bench_flash.txt"; } >>"$LOG"
    while read -r _ key val; do
        case $key in tokens_per_s | mfu_pct | loss_first_last | prof_attention_*) row "flash $key" "" "$val" ;; esac
    done < <(grep '^RESULT ' "$work/bench_flash.txt")
    [ $rc -eq 0 ] || row "bench_gpu_train --flash" FAIL "exit $rc"
fi
if [ -x "$b" ] && [ $((T_END - SECONDS)) -gt 90 ]; then
    withlibs timeout -k 10 "$(left 80)" "$b" --micro 32 --steps 6 --other-steps 0 --profile-steps 0 \
        >"$work/bench_m32.txt" 2>&1
    rc=$?
    { echo "---- bench_gpu_train --micro 32 (exit $rc)"; cat "$work/bench_m32.txt"; } >>"$LOG"
    while read -r _ key val; do
        case $key in tokens_per_s | mfu_pct | peak_bytes | micro) row "bench_gpu_train m32 $key" "" "$val" ;; esac
    done < <(grep '^RESULT ' "$work/bench_m32.txt")
fi

summary
