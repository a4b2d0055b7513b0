# Shared by the pg_test scripts (sourced, from the repository's root).

# in_server MAJOR CMD...: runs CMD in the system that has PostgreSQL MAJOR, from the current
# directory: the machine itself for 15, the version's chroot (pg_test/chroot, which must be up)
# for 17 and 18.
in_server() {
    local major=$1; shift
    if [ "$major" = 15 ]; then
        "$@"
    else
        pg_test/chroot "$major" exec bash -c 'cd "$0" && exec "$@"' "$PWD" "$@"
    fi
}

# The cargo target directory of a version's builds: each its own, so that switching versions
# rebuilds nothing.
target_dir() { if [ "$1" = 15 ]; then echo target; else echo "target/pg$1"; fi; }

# run_regress MAJOR PORT OUTDIR: the pg_regress suite (tests/regress), run by MAJOR's pg_regress
# against the server on PORT, with its results in OUTDIR; on failure prints the diffs and fails.
run_regress() {
    local major=$1 port=$2 outdir=$3 tests
    rm -rf "$outdir" && mkdir -p "$outdir"
    # _setup first (it defines the helpers the others use), then the rest in name order.
    tests="_setup $(cd tests/regress/sql && ls *.sql | sed 's/\.sql$//' | grep -vx _setup | LC_ALL=C sort)"
    # shellcheck disable=SC2086 # one word per test
    if ! in_server "$major" "/usr/lib/postgresql/$major/lib/pgxs/src/test/regress/pg_regress" \
            --host=127.0.0.1 --port="$port" --user=postgres --dbname=pg_fence_regress \
            --inputdir="$PWD/tests/regress" --outputdir="$outdir" $tests; then
        cat "$outdir/regression.diffs" >&2
        return 1
    fi
}

# tally [FILE]: "N passed, M failed", summed over the cargo test, pg_regress and pytest results it reads.
tally() {
    awk '/^test result: /          { passed += $4; failed += $6 }
         / All [0-9]+ tests passed/  { for (i = 1; i < NF; i++) if ($i == "All") passed += $(i + 1) }
         /^=+ .*[0-9]+ (passed|failed).* in [0-9.]+s/ {   # the closing line of pytest
             for (i = 2; i < NF; i++) { w = $(i + 1); sub(/,$/, "", w)
                 if (w == "passed") passed += $i; if (w == "failed" || w == "errors" || w == "error") failed += $i } }
         END { printf "%d passed, %d failed", passed, failed }' "$@"
}

# suite_of MAJOR: the Debian suite whose own packages ship PostgreSQL MAJOR.
suite_of() { case $1 in 15) echo bookworm ;; 17) echo trixie ;; 18) echo forky ;; esac; }

# debootstrap_into MAJOR DIR: a minimal system of suite_of MAJOR in DIR, from the mirror this
# machine's apt uses (no other host is reachable).
debootstrap_into() {
    local mirror script=
    mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    # Debian 12's debootstrap has no script for forky; sid's fits.
    [ "$(suite_of "$1")" = forky ] && script=/usr/share/debootstrap/scripts/sid
    # shellcheck disable=SC2086 # no script: no argument
    debootstrap --variant=minbase "$(suite_of "$1")" "$2" "${mirror:-http://deb.debian.org/debian}" $script
}
