#!/bin/sh
# meson install hook: put the default config in place unless one exists.
set -eu
prefix=${MESON_INSTALL_DESTDIR_PREFIX:-/usr/local}
src=$1 dst=$2
case $src in /*) ;; *) src=$prefix/$src ;; esac
case $dst in /*) dst=${DESTDIR:-}$dst ;; *) dst=$prefix/$dst ;; esac
mkdir -p "$(dirname "$dst")"
if [ -e "$dst" ]; then
    echo "accumd: keeping existing $dst (new default in $src)"
else
    install -m 0644 "$src" "$dst"
    echo "accumd: installed default config $dst"
fi
