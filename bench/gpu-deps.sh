#!/usr/bin/env bash
# Prepare, on the build machine (Debian 12, with apt), what bench/gpu-check.sh
# needs on a GPU machine that has no Debian packages and no network: the .deb
# files of accumd's libraries (and meson, pkgconf) downloaded with apt-get and
# unpacked with dpkg -x into .deps/root, an ignored folder that the device run
# carries (.deps/root only: with .deps/debs the carry would pass 64 MiB).
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(
    libmicrohttpd12 libmicrohttpd-dev libjansson4 libjansson-dev libuv1 libuv1-dev
    libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5
    libinih1 libinih-dev libsystemd0 libsystemd-dev zlib1g zlib1g-dev libcmocka0 libcmocka-dev
    libgnutls30 libnettle8 libhogweed6 libgmp10 libidn2-0 libunistring2 libtasn1-6 libp11-kit0 libffi8
    meson pkgconf pkgconf-bin libpkgconf3
)
mkdir -p .deps/debs .deps/root
if [ ! -f .deps/debs/.done ] || [ "$(cat .deps/debs/.done)" != "${PKGS[*]}" ]; then
    (cd .deps/debs && rm -f ./*.deb && apt-get download "${PKGS[@]}")
    echo "${PKGS[*]}" >.deps/debs/.done
fi
rm -rf .deps/root && mkdir -p .deps/root
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
# links to absolute paths (libz.so -> /lib/.../libz.so.1.2.13) would point
# into the GPU machine's own /lib: make them relative, inside the root
find .deps/root -type l -lname '/*' | while read -r l; do
    ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" ".deps/root$(readlink "$l")")" "$l"
done
# static archives, LAPACK and docs are not needed: keep the carry small
find .deps/root -name '*.a' -delete
rm -rf .deps/root/usr/share/doc .deps/root/usr/share/man .deps/root/usr/share/locale \
       .deps/root/usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack*
# a shared-library build never links the private requirements, but pkg-config
# still looks them up (libmicrohttpd.pc: gnutls): drop them from our copies
find .deps/root -name '*.pc' -exec sed -i '/^Requires.private:/d' {} +
du -sh .deps/root
