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
