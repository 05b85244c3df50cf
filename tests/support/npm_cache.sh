# npm_cache.sh: the pinned npm packages of a folder (package.json +
# package-lock.json) installed once with `npm ci --ignore-scripts` into a
# cache outside the tree, keyed by the lock file's hash. Sourced;
#   npm_cache DIR NAME   sets NPM_CACHE to the install (its node_modules inside)
npm_cache() {
    local dir=$1 name=$2 lock_hash
    lock_hash=$(sha256sum "$dir/package-lock.json" | cut -c1-16)
    NPM_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/$name-$lock_hash
    if [ ! -f "$NPM_CACHE/.complete" ]; then
        rm -rf "$NPM_CACHE" && mkdir -p "$NPM_CACHE"
        cp "$dir/package.json" "$dir/package-lock.json" "$NPM_CACHE/"
        (cd "$NPM_CACHE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) || return 1
        touch "$NPM_CACHE/.complete"
    fi
}
