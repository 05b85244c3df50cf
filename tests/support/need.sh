# need.sh: what a test does when a reference or tool it compares against is
# missing. Sourced by the shell tests; `need_missing "what"` ends the test:
#  - exit 77 (meson's SKIP) by default, so a developer without Chromium or
#    python3-torch can still run the rest;
#  - exit 1 (FAIL) when ACCUMD_REQUIRE_REFS is set, as .ci/test sets it:
#    .ci/setup installs every reference, so in CI a missing one is a broken
#    install, never a silent pass.
need_missing() {
    if [ -n "${ACCUMD_REQUIRE_REFS:-}" ]; then
        echo "FAIL: $* (ACCUMD_REQUIRE_REFS is set: references are required)"
        exit 1
    fi
    echo "SKIP: $*"
    exit 77
}
